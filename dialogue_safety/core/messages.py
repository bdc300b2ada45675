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
the image were not there would answer a question nobody asked. Every message (and every text
part) must show some text: a message without any (``null`` content, a tool call alone) is not a
turn the model can read; leave it out. The HTTP API
(``messages`` in ``/v1/classify``), the ``score`` command (a ``messages`` field per row) and the
Python API (:func:`dialogue_safety.classify_messages`) all read messages here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import VISIBLE_PATTERN
from dialogue_safety.core.schema import Example, Turn

#: chat roles → the speaker names of the datasets' history turns
ROLE_SPEAKERS: dict[str, str] = {"system": "system", "user": "user", "assistant": "bot", "tool": "tool"}
ROLES: tuple[str, ...] = tuple(ROLE_SPEAKERS)
TEXT_PART = "text"
_VISIBLE = re.compile(VISIBLE_PATTERN)


@dataclass(frozen=True, slots=True)
class JudgedMessages:
    """The example a list of messages asks about, and which message it judges (``index`` into the
    messages as sent, and that message's ``role``)."""

    example: Example
    index: int
    role: str
    history_index: tuple[int, ...] = ()  # the index in the messages of each history turn

    def message_field(self, field: str | None, prefix: str = "") -> str | None:
        """A field the item rules name (``utterance``, ``history[2]``) as the message it comes from
        (``messages[4].content``)."""
        if field is None or not field.startswith(prefix):
            return field
        name = field[len(prefix) :]
        if name.startswith("utterance"):
            return f"{prefix}messages[{self.index}].content"
        if name == "history":
            return f"{prefix}messages"
        found = re.match(r"history\[(\d+)\]", name)
        if found and int(found.group(1)) < len(self.history_index):
            return f"{prefix}messages[{self.history_index[int(found.group(1))]}].content"
        return field

    def judged(self) -> dict[str, Any]:
        """What the answer says was judged: ``{"index": ..., "role": ...}``."""
        return {"index": self.index, "role": self.role}


def message_text(content: Any, field: str) -> str:
    """The text of one message's ``content``: a string, or a list of text parts joined with newlines."""
    if isinstance(content, str):
        if _VISIBLE.search(content) is None:
            raise InvalidInput(
                f"{field} shows no text (empty, or only whitespace, zero-width or control characters)",
                code="invalid_message",
                field=field,
            )
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
        if not isinstance(text, str) or _VISIBLE.search(text) is None:
            raise InvalidInput(
                f"{where}.text must be a string that shows some text", code="invalid_message", field=f"{where}.text"
            )
        texts.append(text)
    if not texts:
        raise InvalidInput(f"{field} has no parts; send the message's text", code="invalid_message", field=field)
    return "\n".join(texts)


def read_messages(messages: Any, field: str = "messages") -> list[tuple[str, str]]:
    """Each message's role and text, checked; raises :class:`InvalidInput` naming the message at fault."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidInput(f"{field} must be a list of messages", code="invalid_message", field=field)
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
    return turns


def history_of(
    turns: Sequence[tuple[str, str]], include_system: bool = False
) -> tuple[tuple[Turn, ...], tuple[int, ...]]:
    """The history turns of messages' ``(role, text)`` (system ones only with ``include_system``) and
    the index of each in the messages."""
    kept = tuple(i for i, (role, _) in enumerate(turns) if include_system or role != "system")
    return tuple(Turn(turns[i][1], ROLE_SPEAKERS[turns[i][0]]) for i in kept), kept


def parse_messages(messages: Sequence[Any], *, include_system: bool = False, field: str = "messages") -> JudgedMessages:
    """The last message as the utterance, the earlier ones as history (system ones only with
    ``include_system``); raises :class:`InvalidInput` naming the message at fault (``field``: where
    the list sits in the request, e.g. ``items[2].messages``)."""
    turns = read_messages(messages, field)
    if not turns:
        raise InvalidInput(f"{field} is empty; send at least the message to judge", code="invalid_message", field=field)
    *earlier, (role, utterance) = turns
    history, kept = history_of(earlier, include_system)
    return JudgedMessages(Example(utterance=utterance, history=history), len(turns) - 1, role, kept)
