"""OpenAI chat messages in the classify requests: the request fields and their reading.

``/v1/classify`` and each object item of ``/v1/classify/batch`` accept ``messages`` (OpenAI chat
format) instead of ``history`` + ``utterance``; the rules (which message is judged, what becomes
history, which parts are text) are :mod:`dialogue_safety.core.messages`'s, shared with ``score``
and the Python API. The answer says which message was judged (``judged``: index and role).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.messages import JudgedMessages, parse_messages


class ChatMessage(BaseModel):
    """One OpenAI chat message; other keys (``name``, ``tool_call_id``, ``tool_calls``...) are read past."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = Field(
        description="a string, or a list of text parts {'type': 'text', 'text': ...} (other parts are refused)"
    )


class ChatFields(BaseModel):
    """The request fields of chat messages (a dialogue item has these or history + utterance)."""

    messages: list[ChatMessage] | None = Field(
        None,
        description="instead of history + utterance: OpenAI chat messages; the last one is judged, the earlier ones "
        "are its history (system messages only with include_system)",
    )
    include_system: bool = Field(False, strict=True, description="with messages: keep system messages in the history")


class Judged(BaseModel):
    """Which message of ``messages`` was judged."""

    index: int = Field(ge=0, description="its index in messages")
    role: str


def judged_messages(item: ChatFields, utterance: str | None, history: list[Any], prefix: str) -> JudgedMessages | None:
    """The example ``item``'s messages ask about (None: the item has no messages); raises
    :class:`InvalidInput` for messages sent with history or utterance, or that cannot be read."""
    if item.messages is None:
        if utterance is None:
            raise InvalidInput(f"{prefix}utterance is required", field=f"{prefix}utterance")
        return None
    if utterance is not None or history:
        raise InvalidInput(
            f"{prefix}messages replaces history and utterance: send one or the other",
            field=f"{prefix}messages",
        )
    raw = [m.model_dump(include={"role", "content"}) for m in item.messages]
    return parse_messages(raw, include_system=item.include_system, field=f"{prefix}messages")
