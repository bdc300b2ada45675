"""JSON request bodies checked before the routes parse them: no duplicate keys, no deep nesting.

FastAPI parses a JSON body with ``json.loads``, which keeps the last of two values for one key: a
proxy or filter in front that reads the first sees another text than the model is asked about. And
nesting is only bounded by the parser's recursion. :class:`StrictJsonMiddleware` reads the body as
the route would (after :class:`dialogue_safety.service.limits.BodyGuardMiddleware` has bounded its
size and time) and refuses, with 400 in the service's error shape, an object holding a key twice
(``duplicate_key``) or nesting deeper than :data:`dialogue_safety.core.json_input.MAX_JSON_DEPTH`
(``malformed_json``), by the one reader of JSON from outside (:func:`dialogue_safety.core.json_input.loads`).
Text that is not JSON at all is left to the route, which answers ``malformed_json`` with where it broke.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dialogue_safety.core import json_input
from dialogue_safety.service.errors import MalformedJson, RefusedWhileReading

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _is_json(scope: Scope) -> bool:
    """A body the routes read as JSON: ``application/json``, ``+json``, or no Content-Type (read as JSON)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return True


class StrictJsonMiddleware:
    """Refuse a JSON body with a duplicate key or nested too deeply before any route parses it (pure ASGI;
    the body, once checked, goes on as one message)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        checked = False

        async def checked_receive() -> Message:
            nonlocal checked
            if checked:
                return await receive()  # after the body: e.g. the disconnect watch
            chunks: list[bytes] = []
            while True:
                message = await receive()  # the body guard's: size and time bounded there
                if message["type"] != "http.request":
                    checked = True
                    return message
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            checked = True
            body = b"".join(chunks)
            problem = _problem(body)
            if problem is not None:
                raise RefusedWhileReading(problem)  # answered by the error table, in the JSON error shape
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, checked_receive, send)


def _problem(body: bytes) -> MalformedJson | None:
    if not body.strip():
        return None
    try:
        json_input.loads(body)
    except json_input.DuplicateKey as exc:
        return MalformedJson(f"the body is ambiguous: {exc}; send each key once", code="duplicate_key")
    except json_input.TooDeep as exc:
        return MalformedJson(f"the body could not be read as JSON ({exc})")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # not JSON at all: the route says where it broke
    return None
