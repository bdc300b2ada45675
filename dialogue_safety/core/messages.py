"""OpenAI chat messages → the :class:`Example` they ask us to judge.

A chatbot backend keeps its conversation as chat messages::

    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "what do you think of my neighbours?"},
     {"role": "assistant", "content": [{"type": "text", "text": "they should all be thrown out"}]}]

The **last** message is the utterance judged; the earlier ones are its history, oldest first.
System messages (and ``developer`` ones, OpenAI's newer name for them, read the same way) are
instructions to the bot, not turns of the dialogue: they are left out of the history unless
``include_system`` is set (a system message that is itself the last one is still judged). Tool
traffic is not dialogue either: an assistant message that only calls tools (``content`` null or
absent, ``tool_calls`` or ``function_call`` set) and ``tool`` messages (a tool's result) are
skipped as context; a transcript ends where the model cannot judge it if its last message is a tool
call without text (refused, ``invalid_message``: judge the message before it). Roles become
:attr:`Turn.speaker` values in the convention the datasets use
(:data:`ROLE_SPEAKERS`: ``user`` stays ``user``, ``assistant`` becomes ``bot``), which the model
reads only when its card turns ``speaker_markers`` on (:mod:`dialogue_safety.core.encoding`).

``content`` is a string or a list of parts; text parts (``{"type": "text", "text": ...}``) are
joined with newlines, and any other part (an image, audio, a file) is refused with an
:class:`InvalidInput` naming it: we judge text only, and judging the text around an image as if
the image were not there would answer a question nobody asked. Every message (and every text
part) must show some text: a message without any (``null`` content that is no tool call) is not a
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
from dialogue_safety.core.schema import Example, Prediction, Turn

#: chat roles → the speaker names of the datasets' history turns
ROLE_SPEAKERS: dict[str, str] = {
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system role, read as one
    "user": "user",
    "assistant": "bot",
    "tool": "tool",
}
ROLES: tuple[str, ...] = tuple(ROLE_SPEAKERS)
#: roles whose messages are instructions, not turns (left out of the history unless include_system)
SYSTEM_ROLES = frozenset(r for r, speaker in ROLE_SPEAKERS.items() if speaker == "system")
#: a tool's result: data the bot read, not a turn of the dialogue (never history)
TOOL_ROLE = "tool"
#: the keys of an assistant message that calls tools (OpenAI's current and older names)
TOOL_CALL_KEYS = ("tool_calls", "function_call")
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

    def message_field(
        self, field: str | None, prefix: str = "", where: str = "messages", text: str = ".content"
    ) -> str | None:
        """A field the item rules name (``utterance``, ``history[2]``) as the message it comes from
        (``messages[4].content``; ``where`` and ``text``: how the request names the list and a message's text)."""
        if field is None or not field.startswith(prefix):
            return field
        name = field[len(prefix) :]
        if name.startswith("utterance"):
            return f"{prefix}{where}[{self.index}]{text}"
        mapped = history_field(name, self.history_index, where, text)
        return field if mapped is None else f"{prefix}{mapped}"

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


def is_tool_call(message: Mapping[str, Any]) -> bool:
    """An assistant message that only calls tools: no text (``content`` null, absent or empty) and a tool call."""
    content = message.get("content")
    return (
        message.get("role") == "assistant"
        and (content is None or content == "" or content == [])
        and any(message.get(k) for k in TOOL_CALL_KEYS)
    )


def read_messages(messages: Any, field: str = "messages") -> list[tuple[str, str]]:
    """Each message's role and text, checked; raises :class:`InvalidInput` naming the message at fault.

    A tool call without text (:func:`is_tool_call`) has no text to read: it comes back with the text
    ``""``, which :func:`history_of` skips (a caller that judges it refuses it)."""
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
        if not isinstance(role, str) or role not in ROLE_SPEAKERS:  # a list or an object is not hashable either
            raise InvalidInput(
                f"{where}.role must be one of {', '.join(ROLES)}; got {role!r}"
                if isinstance(role, str | None)
                else f"{where}.role must be a string",
                code="invalid_message",
                field=f"{where}.role",
            )
        if is_tool_call(message):
            turns.append((role, ""))
            continue
        turns.append((role, message_text(message.get("content"), f"{where}.content")))
    return turns


def history_field(name: str, history_index: Sequence[int], where: str, text: str = ".content") -> str | None:
    """``history`` or ``history[i]`` (a field the item rules name) as the messages it comes from: ``where``, or the
    message at ``history_index[i]`` (``messages[4].content``); None for another field."""
    if name == "history":
        return where
    found = re.match(r"history\[(\d+)\]", name)
    if found and int(found.group(1)) < len(history_index):
        return f"{where}[{history_index[int(found.group(1))]}]{text}"
    return None


def history_of(
    turns: Sequence[tuple[str, str]], include_system: bool = False
) -> tuple[tuple[Turn, ...], tuple[int, ...]]:
    """The history turns of messages' ``(role, text)`` (system and developer ones only with
    ``include_system``; never a tool's result or a tool call without text) and the index of each in the
    messages."""
    kept = tuple(
        i
        for i, (role, text) in enumerate(turns)
        if text and role != TOOL_ROLE and (include_system or role not in SYSTEM_ROLES)
    )
    return tuple(Turn(turns[i][1], ROLE_SPEAKERS[turns[i][0]]) for i in kept), kept


def parse_messages(messages: Sequence[Any], *, include_system: bool = False, field: str = "messages") -> JudgedMessages:
    """The last message as the utterance, the earlier ones as history (system ones only with
    ``include_system``); raises :class:`InvalidInput` naming the message at fault (``field``: where
    the list sits in the request, e.g. ``items[2].messages``)."""
    turns = read_messages(messages, field)
    if not turns:
        raise InvalidInput(f"{field} is empty; send at least the message to judge", code="invalid_message", field=field)
    *earlier, (role, utterance) = turns
    if not utterance:
        last = len(turns) - 1
        raise InvalidInput(
            f"{field}[{last}] is a tool call without text: there is nothing to judge in it; send the messages up to "
            "the one you want judged",
            code="invalid_message",
            field=f"{field}[{last}].content",
        )
    history, kept = history_of(earlier, include_system)
    return JudgedMessages(Example(utterance=utterance, history=history), len(turns) - 1, role, kept)


#: the roles judged by default when every turn of a conversation is: the dialogue's own turns
DIALOGUE_ROLES: tuple[str, ...] = ("user", "assistant")


def judged_roles(roles: Sequence[str] | None, field: str = "roles") -> frozenset[str]:
    """The roles to judge (default :data:`DIALOGUE_ROLES`); raises :class:`InvalidInput` for an unknown one."""
    if roles is None:
        return frozenset(DIALOGUE_ROLES)
    unknown = [r for r in roles if r not in ROLE_SPEAKERS]
    if unknown or not roles:
        raise InvalidInput(
            f"{field} must list roles among {', '.join(ROLES)}; got {unknown or 'none'}",
            code="invalid_message",
            field=field,
        )
    return frozenset(roles)


def every_turn(
    messages: Any, *, roles: Sequence[str] | None = None, include_system: bool = False, field: str = "messages"
) -> list[JudgedMessages]:
    """Every message of ``roles`` (default: user and assistant) judged as the last one of the messages up to it:
    one :class:`JudgedMessages` each, in order, its history read as :func:`parse_messages` reads it. A tool
    call without text is never judged. Raises :class:`InvalidInput` when no message is left to judge."""
    wanted = judged_roles(roles)
    turns = read_messages(messages, field)
    if not turns:
        raise InvalidInput(f"{field} is empty; send the conversation to judge", code="invalid_message", field=field)
    judged = []
    for i, (role, text) in enumerate(turns):
        if text and role in wanted:
            history, kept = history_of(turns[:i], include_system)
            judged.append(JudgedMessages(Example(utterance=text, history=history), i, role, kept))
    if not judged:
        raise InvalidInput(
            f"{field} holds no message with text of the roles {sorted(wanted)} to judge",
            code="invalid_message",
            field=field,
        )
    return judged


def every_turn_of_turns(turns: Sequence[Turn], speakers: Sequence[str] | None = None) -> list[JudgedMessages]:
    """:func:`every_turn` for plain dialogue turns (oldest first): each turn (of ``speakers``, default every
    one) judged after the turns before it; ``role`` is the turn's speaker (``""`` without one)."""
    wanted = None if speakers is None else frozenset(speakers)
    return [
        JudgedMessages(Example(utterance=t.text, history=tuple(turns[:i])), i, t.speaker or "", tuple(range(i)))
        for i, t in enumerate(turns)
        if wanted is None or t.speaker in wanted
    ]


@dataclass(frozen=True, slots=True)
class TurnPrediction:
    """The verdict on one turn of a conversation: its ``index`` in the messages (or turns), its ``role``
    (with plain turns, the speaker), and the prediction for it given the turns before it."""

    index: int
    role: str
    prediction: Prediction


def conversation_turns(
    conversation: Sequence[Any], *, roles: Sequence[str] | None = None, include_system: bool = False
) -> list[JudgedMessages]:
    """The turns to judge of ``conversation``: OpenAI chat messages (mappings with a ``role``,
    :func:`every_turn`) or plain turns (texts, :class:`Turn` or ``{"speaker", "text"}``,
    :func:`every_turn_of_turns`; ``roles`` then names speakers)."""
    if conversation and all(isinstance(m, Mapping) and "role" in m for m in conversation):
        return every_turn(conversation, roles=roles, include_system=include_system)
    turns = [
        t if isinstance(t, Turn) else Turn(t["text"], t.get("speaker")) if isinstance(t, Mapping) else Turn(t)
        for t in conversation
    ]
    return every_turn_of_turns(turns, roles)
