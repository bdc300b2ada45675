"""OpenAI chat messages → the :class:`Example` they ask us to judge.

A chatbot backend keeps its conversation as chat messages::

    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "what do you think of my neighbours?"},
     {"role": "assistant", "content": [{"type": "text", "text": "they should all be thrown out"}]}]

The **last** message is the utterance judged; the earlier ones are its history, oldest first.
System messages are instructions to the bot, not turns of the dialogue: they are left out of the
history unless ``include_system`` is set (a system message that is itself the last one is still
judged). Roles become :attr:`Turn.speaker` values in the convention the datasets use
(:data:`ROLE_SPEAKERS`: ``user`` stays ``user``, ``assistant`` becomes ``bot``), which the model
reads only when its card turns ``speaker_markers`` on (:mod:`dialogue_safety.core.encoding`).

``content`` is a string or a list of parts; text parts (``{"type": "text", "text": ...}``) are
joined with newlines, and any other part (an image, audio, a file) is refused with an
:class:`InvalidInput` naming it: we judge text only, and judging the text around an image as if
the image were not there would answer a question nobody asked. The HTTP API
(``messages`` in ``/v1/classify``), the ``score`` command (a ``messages`` field per row) and the
Python API (:func:`dialogue_safety.classify_messages`) all read messages here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.schema import Example, Turn

#: chat roles → the speaker names of the datasets' history turns
ROLE_SPEAKERS: dict[str, str] = {"system": "system", "user": "user", "assistant": "bot", "tool": "tool"}
ROLES: tuple[str, ...] = tuple(ROLE_SPEAKERS)
TEXT_PART = "text"


@dataclass(frozen=True, slots=True)
class JudgedMessages:
    """The example a list of messages asks about, and which message it judges (``index`` into the
    messages as sent, and that message's ``role``)."""

    example: Example
    index: int
    role: str

    def judged(self) -> dict[str, Any]:
        """What the answer says was judged: ``{"index": ..., "role": ...}``."""
        return {"index": self.index, "role": self.role}


def message_text(content: Any, field: str) -> str:
    """The text of one message's ``content``: a string, or a list of text parts joined with newlines."""
    if isinstance(content, str):
        return content
    if content is None:
        raise InvalidInput(f"{field} is missing; send the message's text", code="invalid_message", field=field)
    if not isinstance(content, list | tuple):
        raise InvalidInput(
            f"{field} must be a string or a list of text parts, got {type(content).__name__}",
            code="invalid_message",
            field=field,
        )
    texts = []
    for i, part in enumerate(content):
        where = f"{field}[{i}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if not isinstance(part, Mapping) or not isinstance(kind, str):
            raise InvalidInput(
                f"{where} must be an object {{'type': 'text', 'text': ...}}", code="invalid_message", field=where
            )
        if kind != TEXT_PART:
            raise InvalidInput(
                f"{where} is a '{kind}' part; only text parts can be judged (send the text alone)",
                code="unsupported_content",
                field=where,
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidInput(f"{where}.text must be a string", code="invalid_message", field=f"{where}.text")
        texts.append(text)
    return "\n".join(texts)


def parse_messages(messages: Sequence[Any], *, include_system: bool = False, field: str = "messages") -> JudgedMessages:
    """The last message as the utterance, the earlier ones as history (system ones only with
    ``include_system``); raises :class:`InvalidInput` naming the message at fault (``field``: where
    the list sits in the request, e.g. ``items[2].messages``)."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidInput(f"{field} must be a list of messages", code="invalid_message", field=field)
    if not messages:
        raise InvalidInput(f"{field} is empty; send at least the message to judge", code="invalid_message", field=field)
    turns: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        where = f"{field}[{i}]"
        if not isinstance(message, Mapping):
            raise InvalidInput(
                f"{where} must be an object with 'role' and 'content'", code="invalid_message", field=where
            )
        role = message.get("role")
        if role not in ROLE_SPEAKERS:
            raise InvalidInput(
                f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}"
                if isinstance(role, str | None)
                else f"{where}.role must be a string",
                code="invalid_message",
                field=f"{where}.role",
            )
        turns.append((role, message_text(message.get("content"), f"{where}.content")))
    *earlier, (role, utterance) = turns
    history = tuple(Turn(text, ROLE_SPEAKERS[r]) for r, text in earlier if include_system or r != "system")
    return JudgedMessages(Example(utterance=utterance, history=history), len(messages) - 1, role)
