"""Request limits: what one request may hold and how it must arrive, checked before anything is queued.

Each limit is a setting (``SAFETY_<NAME>``); breaking one is an :class:`InvalidInput` (422)
whose message says what to change. :meth:`Limits.check_example` holds the item-level rules that
single and batch requests share (lengths, counts, texts that are no text: a lone surrogate, or
nothing visible). :class:`BodyGuardMiddleware` guards the body while it arrives: its size (413,
from Content-Length at once, else while streaming), its time (408 after ``body_timeout_s``:
slow or unfinished bodies), the bytes all unfinished bodies may hold together (429 beyond
``max_inflight_body_bytes``), and compressed bodies (415). :func:`apply_to_openapi` writes the
same limits into the OpenAPI schema, so that the schema says what the server enforces.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dialogue_safety.core.schema import Example
from dialogue_safety.service.errors import (
    NOT_TEXT_MESSAGE,
    InvalidInput,
    Overloaded,
    PayloadTooLarge,
    RefusedWhileReading,
    RequestTimeout,
    UnsupportedMediaType,
    error_response,
)
from dialogue_safety.service.settings import ServiceSettings

# Characters that show nothing: whitespace, C0/C1 controls, soft hyphen, zero-width and
# bidirectional marks, word joiners, variation selectors, BOM. An utterance needs one other
# character. The same class is the OpenAPI ``pattern`` of the utterance (one owner).
INVISIBLE_CLASS = (
    "\\s\\u0000-\\u001f\\u007f-\\u009f\\u00ad\\u034f\\u061c\\u115f\\u1160\\u17b4\\u17b5"
    "\\u180b-\\u180f\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u206f\\u3164\\ufe00-\\ufe0f\\ufeff\\uffa0"
)
VISIBLE_PATTERN = f"[^{INVISIBLE_CLASS}]"
_VISIBLE = re.compile(VISIBLE_PATTERN)
_SURROGATE = re.compile("[\\ud800-\\udfff]")
SMALL_BODY_BYTES = 64 * 1024  # = uvicorn's per-connection read buffer high-water mark


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_history_turns: int = 32
    max_turn_chars: int = 4000
    max_utterance_chars: int = 4000
    max_batch_items: int = 256
    max_body_bytes: int = 2 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> Limits:
        return cls(
            max_request_history_turns=settings.max_request_history_turns,
            max_turn_chars=settings.max_turn_chars,
            max_utterance_chars=settings.max_utterance_chars,
            max_batch_items=settings.max_batch_items,
            max_body_bytes=settings.max_body_bytes,
        )

    def check_example(self, example: Example, prefix: str = "") -> None:
        """Raise :class:`InvalidInput` for the first rule this item breaks (single and batch requests,
        and each item of a batch, go through here; ``prefix`` is e.g. ``items[3].``)."""
        self.check_item(example.utterance, [t.text for t in example.history], prefix)
        for i, turn in enumerate(example.history):
            if turn.speaker is not None and _SURROGATE.search(turn.speaker):
                raise _not_text(f"{prefix}history[{i}].speaker")

    def check_item(self, utterance: str, turns: Sequence[str], prefix: str = "") -> None:
        """Raise :class:`InvalidInput` for the first limit this item breaks."""
        if _VISIBLE.search(utterance) is None:
            raise InvalidInput(
                "the utterance is empty or shows nothing (only whitespace, zero-width or control characters); "
                "send the text to classify",
                code="empty_utterance",
                field=f"{prefix}utterance",
            )
        if len(utterance) > self.max_utterance_chars:
            raise InvalidInput(
                f"the utterance has {len(utterance)} characters; at most {self.max_utterance_chars} are "
                "accepted (SAFETY_MAX_UTTERANCE_CHARS)",
                code="utterance_too_long",
                field=f"{prefix}utterance",
            )
        if len(turns) > self.max_request_history_turns:
            raise InvalidInput(
                f"the history has {len(turns)} turns; send at most the {self.max_request_history_turns} most recent "
                "(or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
                code="too_many_history_turns",
                field=f"{prefix}history",
            )
        for i, text in enumerate(turns):
            if len(text) > self.max_turn_chars:
                raise InvalidInput(
                    f"history turn {i} has {len(text)} characters; at most {self.max_turn_chars} are accepted "
                    "(SAFETY_MAX_TURN_CHARS)",
                    code="turn_too_long",
                    field=f"{prefix}history[{i}]",
                )
        if _SURROGATE.search(utterance):
            raise _not_text(f"{prefix}utterance")
        for i, text in enumerate(turns):
            if _SURROGATE.search(text):
                raise _not_text(f"{prefix}history[{i}]")

    def check_batch(self, n_items: int) -> None:
        if n_items == 0:
            raise InvalidInput("items is empty; send at least one item", code="empty_batch", field="items")
        if n_items > self.max_batch_items:
            raise InvalidInput(
                f"{n_items} items in one request; send at most {self.max_batch_items} per request "
                "(SAFETY_MAX_BATCH_ITEMS)",
                code="too_many_items",
                field="items",
            )


def _not_text(field: str) -> InvalidInput:
    return InvalidInput(NOT_TEXT_MESSAGE, code="invalid_text", field=field)


class BodyGuardMiddleware:
    """Guard request bodies while they arrive (pure ASGI, before the body is parsed).

    * larger than ``max_body_bytes``: 413 at once from Content-Length, else as soon as the
      streamed length passes it;
    * not complete within ``body_timeout_s`` of the request's start (a slow or unfinished body,
      or a body shorter than its Content-Length): 408, and the connection is closed;
    * when the unfinished bodies of all requests would hold more than ``max_inflight_body_bytes``
      (Content-Length counts at once): 429, so that many slow uploads cannot fill the memory.
      Bodies up to ``SMALL_BODY_BYTES`` are not counted: uvicorn buffers at most that much per
      connection anyway (its read high-water mark), so their memory is bounded by the connection
      cap, and ordinary requests are never refused because large uploads hold the budget;
    * a ``Content-Encoding`` (gzip, deflate...): 415 (send plain JSON).

    (FastAPI's own ``max_body_size`` answers a plain-text 413 that replaces any JSON error; this
    one keeps the service's error shape.)
    """

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout_s: float | None = None,
        max_inflight_body_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_inflight_body_bytes = max_inflight_body_bytes
        self.inflight_bytes = 0  # bytes reserved by the bodies being received right now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        encoding = _header(scope, b"content-encoding")
        if encoding is not None and encoding.strip().lower() not in {b"", b"identity"}:
            refusal = UnsupportedMediaType(
                f"Content-Encoding {encoding.decode('latin-1')!r} is not supported: send the body uncompressed"
            )
            await error_response(refusal, close=True)(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await error_response(_too_large(declared, self.max_body_bytes), close=True)(scope, receive, send)
            return
        reserved = declared if declared is not None and declared > SMALL_BODY_BYTES else 0
        if not self._reserve(reserved):
            await error_response(self._busy(), close=True)(scope, receive, send)
            return
        received = 0
        complete = False
        loop = asyncio.get_running_loop()
        deadline = None if self.body_timeout_s is None else loop.time() + self.body_timeout_s

        async def guarded_receive() -> Message:
            nonlocal received, reserved, complete
            if complete:
                return await receive()  # the body is in: e.g. the disconnect watch, unbounded
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RefusedWhileReading(
                    RequestTimeout(
                        f"the request body did not arrive within {self.body_timeout_s:g} s (SAFETY_BODY_TIMEOUT_S; "
                        f"{received} bytes received); send the whole body, as many bytes as Content-Length says"
                    ),
                    close=True,
                ) from None
            if message["type"] != "http.request":
                complete = True
                return message
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise RefusedWhileReading(_too_large(received, self.max_body_bytes), close=True)
            if received > reserved and received > SMALL_BODY_BYTES:
                if not self._reserve(received - reserved):
                    raise RefusedWhileReading(self._busy(), close=True)
                reserved = received
            if not message.get("more_body", False):
                complete = True
                self._release(reserved)
                reserved = 0
            return message

        try:
            await self.app(scope, guarded_receive, send)
        finally:
            self._release(reserved)

    def _reserve(self, n: int) -> bool:
        if self.max_inflight_body_bytes is not None and self.inflight_bytes + n > self.max_inflight_body_bytes:
            return False
        self.inflight_bytes += n
        return True

    def _release(self, n: int) -> None:
        self.inflight_bytes -= n

    def _busy(self) -> Overloaded:
        return Overloaded(
            f"the request bodies being received hold {self.inflight_bytes} bytes, the most the service buffers "
            "(SAFETY_MAX_INFLIGHT_BODY_BYTES); retry later"
        )


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body has {size} bytes; at most {limit} are accepted (SAFETY_MAX_BODY_BYTES): "
        "send fewer or shorter items per request"
    )


def apply_to_openapi(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
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
        batch["items"].update(minItems=1, maxItems=limits.max_batch_items)
        for branch in batch["items"].get("items", {}).get("oneOf", []):
            if branch.get("type") == "string":
                branch.update(minLength=1, maxLength=limits.max_utterance_chars, pattern=VISIBLE_PATTERN)
    return schema
