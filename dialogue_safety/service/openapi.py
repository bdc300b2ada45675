"""The OpenAPI document, built in one place: FastAPI's schema of the routes, with what the server enforces
written in (the request limits: lengths, counts, the visible character a text needs; the shape of chat messages;
a classify request's ``utterance`` or ``messages``, not both; the moderation request's limits), and, per call,
the versions of the package and of the model serving now.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from dialogue_safety.core.limits import VISIBLE_PATTERN, Limits
from dialogue_safety.core.messages import ROLES, TOOL_CALL_KEYS
from dialogue_safety.service.routes import package_version
from dialogue_safety.service.schemas import ChatMessage, TextInput
from dialogue_safety.service.state import ServiceState


def install_openapi(app: FastAPI, state: ServiceState) -> None:
    """Serve ``app``'s OpenAPI document with the limits of ``state`` written in (built once) and the model
    serving now (added per call: the model may be swapped while the API stays)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_limits(generate(), state.limits)
        info = {**app.openapi_schema["info"], "x-package-version": package_version()}
        info["x-model"] = state.model_id or None
        return {**app.openapi_schema, "info": info}

    app.openapi = openapi  # type: ignore[method-assign]


def with_limits(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Write what the server enforces under ``limits`` into the generated OpenAPI ``schema``, in place."""
    _classify_limits(schema, limits)
    _chat_messages(schema, limits)
    _moderation_limits(schema, limits)
    return schema


def _classify_limits(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Write the enforced limits into the generated OpenAPI schema (lengths, counts, the visible
    character an utterance needs), in place; returns ``schema``."""
    components = schema.get("components", {}).get("schemas", {})
    request = components.get("ClassifyRequest", {}).get("properties", {})
    if "utterance" in request:
        request["utterance"].update(minLength=1, maxLength=limits.max_utterance_chars, pattern=VISIBLE_PATTERN)
    if "history" in request:
        request["history"]["maxItems"] = limits.max_request_history_turns
        for branch in request["history"].get("items", {}).get("oneOf", []):
            if branch.get("type") == "string":
                branch["maxLength"] = limits.max_turn_chars
    turn = components.get("TurnIn", {}).get("properties", {})
    if "text" in turn:
        turn["text"]["maxLength"] = limits.max_turn_chars
    batch = components.get("BatchRequest", {}).get("properties", {})
    if "items" in batch:
        # Each item is checked on its own: one that is not a dialogue item or a string, or breaks a limit
        # (empty, invisible, too long...), gets {"error": ...} in its slot (item_errors=report, the default),
        # so the schema leaves the items open (anything else: 200 with that slot's error).
        batch["items"].update(minItems=1, maxItems=limits.max_batch_items)
        shapes = batch["items"].get("items", {}).get("oneOf", [])
        batch["items"]["items"] = {
            "anyOf": [*shapes, {"description": "any other value: refused in its own slot of results"}],
            "description": "a dialogue item (object) or a comment (string); an item that is neither, or that "
            "breaks a limit, gets {'error': ...} in its own slot",
        }
    return schema


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


def _chat_messages(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
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


def _moderation_limits(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Write the limits a moderation request must keep into the generated OpenAPI schema, in place."""
    components = schema.get("components", {}).get("schemas", {})
    chars = min(limits.max_turn_chars, limits.max_utterance_chars)
    text = {"type": "string", "minLength": 1, "maxLength": limits.max_utterance_chars, "pattern": VISIBLE_PATTERN}
    if "TextInput" in components:
        components["TextInput"] = {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["text"]},
                "text": {**text, "maxLength": chars},
            },
            "required": ["type", "text"],
            "description": TextInput.__doc__,
        }
    request = components.get("ModerationRequest", {}).get("properties", {})
    if "input" in request:
        for branch in request["input"].get("anyOf", []):
            if branch.get("type") == "string":
                branch.update(text)
            elif branch.get("items", {}).get("type") == "string":
                branch.update(minItems=1, maxItems=limits.max_batch_items)
                branch["items"].update(text)
            elif branch.get("type") == "array":
                branch.update(minItems=1)
    if "conversation" in request:
        for branch in request["conversation"].get("anyOf", []):
            if branch.get("type") == "array":
                branch["maxItems"] = limits.max_request_history_turns
    return schema
