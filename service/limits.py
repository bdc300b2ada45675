"""Request limits: what one request may hold, checked before anything is queued.

Each limit is a setting (``SAFETY_<NAME>``); breaking one is an :class:`InvalidInput` (422)
whose message says what to change, or for the body size a 413 from
:class:`BodyLimitMiddleware` (declared Content-Length, then the streamed length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import InvalidInput, PayloadTooLarge, error_response
from service.settings import ServiceSettings


@dataclass(frozen=True)
class LimitRow:
    setting: str
    code: str
    status: int
    what: str


# The table docs/api.md reproduces.
LIMIT_TABLE: tuple[LimitRow, ...] = (
    LimitRow("max_body_bytes", "payload_too_large", 413, "request body bytes (Content-Length or streamed)"),
    LimitRow("max_batch_items", "too_many_items", 422, "items in one /v1/classify/batch request"),
    LimitRow("max_history_turns", "too_many_history_turns", 422, "history turns per item"),
    LimitRow("max_turn_chars", "turn_too_long", 422, "characters in one history turn"),
    LimitRow("max_utterance_chars", "utterance_too_long", 422, "characters in the utterance"),
    LimitRow("-", "empty_utterance", 422, "the utterance is empty or only whitespace"),
    LimitRow("-", "empty_batch", 422, "a batch request with no items"),
    LimitRow("-", "invalid_threshold", 422, "threshold is not a number in [0, 1]"),
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_history_turns: int = 32
    max_turn_chars: int = 4000
    max_utterance_chars: int = 4000
    max_batch_items: int = 256
    max_body_bytes: int = 2 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> Limits:
        return cls(
            max_history_turns=settings.max_history_turns,
            max_turn_chars=settings.max_turn_chars,
            max_utterance_chars=settings.max_utterance_chars,
            max_batch_items=settings.max_batch_items,
            max_body_bytes=settings.max_body_bytes,
        )

    def check_item(self, utterance: str, turns: Sequence[str], prefix: str = "") -> None:
        """Raise :class:`InvalidInput` for the first limit this item breaks."""
        if not utterance or utterance.isspace():
            raise InvalidInput(
                "the utterance is empty; send the text to classify",
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
        if len(turns) > self.max_history_turns:
            raise InvalidInput(
                f"the history has {len(turns)} turns; send at most the {self.max_history_turns} most recent "
                "(SAFETY_MAX_HISTORY_TURNS)",
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


class BodyTooLarge(HTTPException):
    """Raised while the body streams in; an HTTPException so that FastAPI's body reader lets it
    through to the error table (which answers 413 in the JSON error shape)."""

    def __init__(self) -> None:
        super().__init__(status_code=413, detail="the request body is too large")


class BodyLimitMiddleware:
    """Refuse bodies over ``max_body_bytes``: at once from Content-Length, else while streaming.

    (FastAPI's own ``max_body_size`` answers a plain-text 413 that replaces any JSON error; this
    one keeps the service's error shape.)
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.max_body_bytes:
                await error_response(_too_large(declared, self.max_body_bytes))(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server enforces Content-Length framing
            return
        received = 0
        limit = self.max_body_bytes

        async def receive_with_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge()
            return message

        await self.app(scope, receive_with_limit, send)


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
