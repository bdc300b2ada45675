"""OpenAI chat messages in the classify requests: the request fields, their reading and their schema.

``/v1/classify`` and each object item of ``/v1/classify/batch`` accept ``messages`` (OpenAI chat
format) instead of ``history`` + ``utterance``; the rules (which message is judged, what becomes
history, which parts are text) are :mod:`dialogue_safety.core.messages`'s, shared with ``score``
and the Python API. The answer says which message was judged (``judged``: index and role).
The item limits are the API's own (:class:`dialogue_safety.core.limits.Limits`), reported on the
message at fault (``messages[3].content``); a request may hold at most
``max_request_history_turns + 1`` messages, system messages included.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import VISIBLE_PATTERN, Limits
from dialogue_safety.core.messages import ROLES, TOOL_CALL_KEYS, JudgedMessages, parse_messages


class ChatMessage(BaseModel):
    """One OpenAI chat message; other keys (``name``, ``tool_call_id``...) are read past. ``developer`` is read as
    ``system``; an assistant message that only calls tools (``tool_calls``, null content) and ``tool`` messages
    are skipped as context (:mod:`dialogue_safety.core.messages`, which checks role and content: its errors name
    the field as sent, ``messages[1].content``)."""

    model_config = ConfigDict(extra="allow")
    role: Any = Field(description=f"one of {', '.join(ROLES)}")
    content: Any = Field(
        None,
        description="a string, or a list of text parts {'type': 'text', 'text': ...} (other parts are refused); "
        "it must show some text (null only in an assistant message with tool_calls)",
    )

    def as_sent(self) -> dict[str, Any]:
        """The message as the client sent it (role, content and the other keys), for the readers of messages."""
        return self.model_dump()


class ChatFields(BaseModel):
    """The request fields of chat messages (a dialogue item has these or history + utterance)."""

    messages: list[ChatMessage] | None = Field(
        None,
        description="instead of history + utterance: OpenAI chat messages; the last one is judged, the earlier ones "
        "are its history (system messages only with include_system)",
    )
    include_system: bool = Field(False, strict=True, description="with messages: keep system messages in the history")

    @field_validator("utterance", "messages", mode="before", check_fields=False)
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # left out, these default to None; sent as null they would say nothing of which one was meant
        if value is None:
            raise ValueError("null is not accepted; leave the field out instead")
        return value


class Judged(BaseModel):
    """Which message of ``messages`` was judged."""

    index: int = Field(ge=0, description="its index in messages")
    role: str


def judged_messages(
    item: ChatFields, utterance: str | None, history: list[Any], prefix: str, limits: Limits
) -> JudgedMessages | None:
    """The example ``item``'s messages ask about, checked by the item rules (None: the item has no
    messages); raises :class:`InvalidInput` for messages sent with history or utterance, or that
    cannot be read, naming the message at fault."""
    if item.messages is None:
        if utterance is None:
            raise InvalidInput(f"{prefix}utterance is required", field=f"{prefix}utterance")
        return None
    field = f"{prefix}messages"
    if utterance is not None or history:
        raise InvalidInput(f"{field} replaces history and utterance: send one or the other", field=field)
    if len(item.messages) > limits.max_request_history_turns + 1:
        raise InvalidInput(
            f"{field} has {len(item.messages)} messages; send at most the {limits.max_request_history_turns + 1} most "
            "recent (or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
            code="too_many_history_turns",
            field=field,
        )
    raw = [m.as_sent() for m in item.messages]
    judged = parse_messages(raw, include_system=item.include_system, field=field)
    try:
        limits.check_example(judged.example, prefix)
    except InvalidInput as exc:
        exc.field = judged.message_field(exc.field, prefix)
        raise
    return judged


def message_schema(limits: Limits) -> dict[str, Any]:
    """The OpenAPI schema of one chat message under ``limits`` (what the server accepts)."""
    chars = min(limits.max_turn_chars, limits.max_utterance_chars)
    text = {"type": "string", "minLength": 1, "maxLength": chars, "pattern": VISIBLE_PATTERN}
    part = {
        "type": "object",
        "properties": {"type": {"type": "string", "enum": ["text"]}, "text": text},
        "required": ["type", "text"],
    }
    return {
        "type": "object",
        "properties": {
            "role": {"type": "string", "enum": list(ROLES)},
            "content": {"anyOf": [text, {"type": "array", "minItems": 1, "items": part}, {"type": "null"}]},
            **{
                key: {"description": "a tool call: with null content, the message is skipped"} for key in TOOL_CALL_KEYS
            },
        },
        "required": ["role"],
        "description": ChatMessage.__doc__,
    }


def not_null(prop: dict[str, Any]) -> dict[str, Any]:
    """An ``anyOf [X, null]`` property schema as X, with the property's own keywords kept."""
    branches = [b for b in prop.get("anyOf", []) if b.get("type") != "null"]
    if len(branches) != 1:
        return prop
    rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
    return {**branches[0], **rest}


def apply_to_openapi(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Write the rules of chat messages into the generated OpenAPI schema, in place: the message
    shape and limits, and that a classify request has ``utterance`` or ``messages``, not both."""
    components = schema.get("components", {}).get("schemas", {})
    if "ChatMessage" in components:
        components["ChatMessage"] = message_schema(limits)
    request = components.get("ClassifyRequest")
    if request is not None and "messages" in request.get("properties", {}):
        properties = request["properties"]
        for name in ("utterance", "messages"):  # optional, but never null (see ChatFields._not_null)
            properties[name] = not_null(properties[name])
        properties["messages"].update(minItems=1, maxItems=limits.max_request_history_turns + 1)
        request["oneOf"] = [
            {"required": ["utterance"], "not": {"required": ["messages"]}},
            {"required": ["messages"], "not": {"required": ["utterance"]}, "properties": {"history": {"maxItems": 0}}},
        ]
    return schema
