"""Corpus scoring: a file of comments or dialogues in, a file of scores out (local or Ray Data)."""
