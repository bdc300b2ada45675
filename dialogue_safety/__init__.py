"""Context-aware dialogue safety: is the last message of a conversation offensive, given what came before it?"""
