"""Request limits: what one request may hold and how it must arrive, checked before anything is queued.

Each limit is a setting (``SAFETY_<NAME>``); breaking one is an error (422 for an item, from
:class:`dialogue_safety.core.limits.Limits`, whose rules single and batch requests share) whose message
says what to change. :class:`BodyGuardMiddleware` guards the body while it arrives: its size (413,
from Content-Length at once, else while streaming), its time (408 after ``body_timeout_s``:
slow or unfinished bodies), the bytes all unfinished bodies may hold together (429 beyond
``max_inflight_body_bytes``), and compressed bodies (415). :mod:`dialogue_safety.service.openapi` writes the
same limits into the OpenAPI schema, so that the schema says what the server enforces.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import Limits
from dialogue_safety.service.errors import (
    Overloaded,
    PayloadTooLarge,
    RefusedWhileReading,
    RequestTimeout,
    UnsupportedMediaType,
    error_response,
)

SMALL_BODY_BYTES = 64 * 1024  # = uvicorn's per-connection read buffer high-water mark
MAX_PAUSE_S = 60.0  # the longest a client's large bodies are paused after one is refused
# a paused client's large body waits (unread) this long at most before its 429: a client that retries at once
# costs the event loop a few skipped bodies a second, not one per round trip (the figures: lab/notes/abuse.md)
PAUSED_ANSWER_DELAY_S = 0.15
_PAUSES_KEPT = 4096  # clients with a pause on record before the ended ones are swept


class LargeBodies:
    """One client's share of the event loop's body work: what bounds how much of it a client can cause.

    Reading a body larger than ``SMALL_BODY_BYTES`` and counting it costs the event loop work in proportion
    to its bytes (uvicorn's reads, the hand-off of each chunk), which a refusal does not give back: without a
    bound, a client sending hostile large bodies back to back takes the loop for as long as it likes.
    Per client (by address, as admission charges: :func:`dialogue_safety.service.admission.http_client`):

    * **one at a time**: a large body arriving while another of the same client's is being read or counted
      waits for it (unread: the server reads no more of it than its buffer holds), then goes on, or is
      refused if that one was;
    * **a pause after a refusal**: once one of its large bodies has been answered 4xx (a count past its limit,
      too costly, malformed...), the client's next large body is refused 429 before it is read, for
      ``1/share - 1`` times as long as the refused one took, from its first byte to its answer (at most
      :data:`MAX_PAUSE_S`): a client's refused large bodies take at most ``share`` of the service's time.
      Its small bodies (what an ordinary request is) pass meanwhile, and bodies answered 2xx (or 429: nothing
      was counted) pause nothing. A body that arrives in a pause waits for its end, unread, for
      :data:`PAUSED_ANSWER_DELAY_S` at most, then is read or refused: the connection stays open (the server
      skips the unread body), and a client retrying at once is answered a few times a second, not as fast as it sends.
    """

    def __init__(
        self, share: float = 1.0, clock: Callable[[], float] = time.monotonic, delay_s: float = PAUSED_ANSWER_DELAY_S
    ) -> None:
        self.share = share
        self.clock = clock
        self.delay_s = delay_s
        self.reading: dict[str, asyncio.Event] = {}  # client -> set when its large body being read is counted
        self.paused: dict[str, tuple[float, int, float]] = {}  # client -> (until, refused status, its seconds)

    async def start(self, client: str) -> Overloaded | None:
        """The 429 for ``client``'s large body about to be read, or None once it may be read (after the
        client's large body being read now, if any): then call :meth:`done` when it is counted or given up."""
        while True:
            if self._paused(client) is not None:  # wait (unread) for the pause's end, or delay_s at most
                await asyncio.sleep(min(self.delay_s, self.paused[client][0] - self.clock()))
                refusal = self._paused(client)
                if refusal is not None:
                    return refusal
                continue
            reading = self.reading.get(client)
            if reading is None:
                self.reading[client] = asyncio.Event()
                return None
            await reading.wait()

    def done(self, client: str) -> None:
        """``client``'s large body is counted (or given up): its next may be read."""
        reading = self.reading.pop(client, None)
        if reading is not None:
            reading.set()

    def refused(self, client: str, status: int, took_s: float) -> None:
        """``client``'s large body was answered ``status`` (4xx) ``took_s`` after its first byte: pause its
        large bodies for ``1/share - 1`` times that."""
        if self.share >= 1.0:
            return
        now = self.clock()
        if len(self.paused) >= _PAUSES_KEPT:
            self.paused = {c: p for c, p in self.paused.items() if p[0] > now}
        self.paused[client] = (now + min(MAX_PAUSE_S, took_s * (1.0 / self.share - 1.0)), status, took_s)

    def _paused(self, client: str) -> Overloaded | None:
        pause = self.paused.get(client)
        if pause is None:
            return None
        until, status, took = pause
        wait = until - self.clock()
        if wait <= 0:
            del self.paused[client]
            return None
        return Overloaded(
            f"this client's last request body over {SMALL_BODY_BYTES} bytes was refused ({status}) after "
            f"{took * 1000:.0f} ms of the service's work; send another such body in {wait:.1f} s "
            "(SAFETY_REFUSED_BODY_SHARE), or fix what that answer names first; requests of at most "
            f"{SMALL_BODY_BYTES} bytes are read meanwhile",
            retry_after_s=max(1, math.ceil(wait)),
        )


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
        declared = content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await error_response(_too_large(self.max_body_bytes, declared), close=True)(scope, receive, send)
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
                raise RefusedWhileReading(_too_large(self.max_body_bytes), close=True)
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


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(limit: int, declared: int | None = None) -> PayloadTooLarge:
    """The 413: the limit, and that the body exceeded it (its size only when declared: a streamed body is
    refused as soon as it passes the limit, so the bytes read by then are not its size)."""
    size = f"has {declared} bytes (Content-Length)" if declared is not None else "exceeded the limit while streaming"
    return PayloadTooLarge(
        f"the request body {size}; at most {limit} bytes are accepted (SAFETY_MAX_BODY_BYTES): "
        "send fewer or shorter items per request"
    )


#: keys one JSON object of a ``/v1/*`` body may have: request objects have a few (an OpenAI chat message,
#: which may carry other keys, some more); each key of a model that forbids unknown fields would be one error
MAX_OBJECT_KEYS = 256
_TURN_LISTS = frozenset({"history", "conversation", "messages"})


def check_counts(data: Any, limits: Limits) -> InvalidInput | None:
    """The first count or size ``data`` (a parsed ``/v1/*`` body) breaks, before any element is validated,
    or None: the request-level lists at their own limits (``items`` and ``input``: ``max_batch_items``;
    ``history`` and ``conversation``: ``max_request_history_turns``; ``messages``: one more), any other
    list at :attr:`Limits.max_list_items`, any object at :data:`MAX_OBJECT_KEYS` keys. Work: one look at
    each list's length and each object's keys, stopping at the first list too long (its elements are never
    looked at)."""
    if isinstance(data, dict):
        for name, error in (
            ("items", limits.too_many_items),
            ("input", limits.too_many_items),
        ):
            value = data.get(name)
            if isinstance(value, list) and len(value) > limits.max_batch_items:
                return error(len(value), name)
        for name in sorted(_TURN_LISTS):
            value = data.get(name)
            most = limits.max_request_history_turns + (name == "messages")
            if isinstance(value, list) and len(value) > most:
                return limits.too_many_turns(len(value), name, messages=name == "messages")
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, list):
            if len(value) > limits.max_list_items:
                return _too_many_elements(len(value), path, limits)
            stack.extend((v, (*path, i)) for i, v in enumerate(value) if isinstance(v, list | dict))
        elif isinstance(value, dict):
            if len(value) > MAX_OBJECT_KEYS:
                return InvalidInput(
                    f"{_field(path) or 'the body'} has {len(value)} keys; an object in a request has at most "
                    f"{MAX_OBJECT_KEYS}",
                    code="invalid_request",
                    field=_field(path),
                )
            for key, v in value.items():
                if isinstance(v, list | dict):
                    stack.append((v, (*path, key)))
    return None


# scan_counts: a request-level list of scalars and empty objects (no string or list in it: an object without
# a string has no key), found in the raw bytes
_REQUEST_LIST = re.compile(rb'"(items|input|history|conversation|messages)"\s*:\s*\[')
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_PAIR = re.compile(rb"\[\]|\{\}")


def scan_counts(body: bytes, limits: Limits) -> InvalidInput | None:
    """:func:`check_counts`'s refusal of a request-level list (``items``, ``input``, ``history``,
    ``conversation``, ``messages`` of the body's top-level object) of more than
    :attr:`Limits.max_list_items` scalars or empty objects, found in the raw body by a few scans of its bytes, without
    parsing it: a million invalid items (``[0, 0, ...]``) cost no parsed value at all. None: no such list
    (the parsed body is then counted by :func:`check_counts`, which finds every case)."""
    if body.count(b",") < limits.max_list_items:
        return None  # no list can have more elements than the body has commas, plus one
    for found in _REQUEST_LIST.finditer(body):
        start, end = found.end(), body.find(b"]", found.end())  # the list's end, if nothing in it is a list
        n = body.count(b",", start, end) + 1
        if (
            end < 0
            or n <= limits.max_list_items
            or body.find(b'"', start, end) >= 0
            or body.find(b"[", start, end) >= 0
        ):
            continue  # short, or not scalars and empty objects only: counted once parsed
        before = _ESCAPE.sub(b"", body[: found.start()])
        if before.count(b'"') % 2:
            continue  # the key is inside a string
        opened = _NOT_BRACKET.sub(b"", _STRING.sub(b"", before))
        while (closed := _PAIR.sub(b"", opened)) != opened:
            opened = closed
        if opened != b"{":
            continue  # not a value of the top-level object
        name = found.group(1).decode()
        if name in _TURN_LISTS:
            return limits.too_many_turns(n, name, messages=name == "messages")
        return limits.too_many_items(n, name)
    return None


def _too_many_elements(n: int, path: tuple[str | int, ...], limits: Limits) -> InvalidInput:
    return InvalidInput(
        f"{_field(path) or 'the body'} has {n} elements; a list in a request holds at most "
        f"{limits.max_list_items} (SAFETY_MAX_BATCH_ITEMS, SAFETY_MAX_REQUEST_HISTORY_TURNS)",
        code="too_many_history_turns" if path and path[-1] in _TURN_LISTS else "too_many_items",
        field=_field(path),
    )


def _field(path: tuple[str | int, ...]) -> str | None:
    """``("items", 3, "history")`` → ``items[3].history`` (None: the body itself)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or None
