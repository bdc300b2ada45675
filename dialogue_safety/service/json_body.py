"""JSON request bodies checked before the routes parse them: no duplicate keys, no deep nesting, no
count past a limit.

FastAPI parses a JSON body with ``json.loads``, which keeps the last of two values for one key: a
proxy or filter in front that reads the first sees another text than the model is asked about. And
nesting is only bounded by the parser's recursion. :class:`StrictJsonMiddleware` reads the body as
the route would (after :class:`dialogue_safety.service.limits.BodyGuardMiddleware` has bounded its
size and time) and refuses, with 400 in the service's error shape, an object holding a key twice
(``duplicate_key``) or nesting deeper than :data:`dialogue_safety.core.json_input.MAX_JSON_DEPTH`
(``malformed_json``), by the one reader of JSON from outside (:func:`dialogue_safety.core.json_input.loads`).
Text that is not JSON at all is left to the route, which answers ``malformed_json`` with where it broke.

Cheap before costly: a ``/v1/*`` body's counts (items, texts, history turns, messages, any list, any
object's keys) are checked on the parsed JSON before any element is validated
(:func:`dialogue_safety.service.limits.check_counts`): a list past its limit refuses the request (422,
naming the field and the limit) and none of its elements is looked at, so a million invalid items cost
one parse, not a million validation errors (and a request-level list of a million scalars not even
that: :func:`dialogue_safety.service.limits.scan_counts` counts it in the raw bytes). A body larger than
``OFF_LOOP_BYTES`` is parsed and checked in one helper thread (one body at a time; the C parser holds the
interpreter while it runs, so the event loop waits at most one parse, not one per body).

What one client's large bodies (over ``SMALL_BODY_BYTES``) may cost the event loop is bounded too
(:class:`dialogue_safety.service.limits.LargeBodies`): they are read one at a time, and after one is
refused (4xx) the client's next is refused 429 before it is read, for a pause proportional to the work the
refused one took (``SAFETY_REFUSED_BODY_SHARE``); the client's small bodies pass meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dialogue_safety.core import json_input
from dialogue_safety.core.errors import ServiceError
from dialogue_safety.core.limits import Limits
from dialogue_safety.service.admission import http_client
from dialogue_safety.service.errors import MalformedJson, RefusedWhileReading
from dialogue_safety.service.limits import (
    SMALL_BODY_BYTES,
    LargeBodies,
    check_counts,
    content_length,
    scan_counts,
)

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: bodies larger than this are parsed and checked off the event loop (smaller ones cost less than the hand-off)
OFF_LOOP_BYTES = SMALL_BODY_BYTES
COUNTED_PREFIX = "/v1/"  # the routes whose bodies' counts are checked (the API's, not the admin's or the game's)


def _is_json(scope: Scope) -> bool:
    """A body the routes read as JSON: ``application/json``, ``+json``, or no Content-Type (read as JSON)."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))
    return True


class _Body:
    """One request's body as :class:`StrictJsonMiddleware` reads it: its size so far, whether it holds its
    client's place for a large body (:class:`LargeBodies`), and what it was answered."""

    __slots__ = ("answered", "began", "holds", "large", "left", "size", "status")

    def __init__(self) -> None:
        self.size = 0
        self.large = False  # over SMALL_BODY_BYTES, and read (its client's place was taken)
        self.holds = False  # holds its client's place now (until it is counted)
        self.status = 0
        self.began = 0.0  # when it took its client's place
        self.answered = 0.0
        self.left = False  # the client hung up before its whole body came: nobody is answered, nothing paused


class StrictJsonMiddleware:
    """Refuse a JSON body with a duplicate key, nested too deeply or (``/v1/*``, with ``limits``) past a
    count limit before any route parses it (pure ASGI; the body, once checked, goes on as one message);
    and bound each client's large bodies (``refused_body_share``: :class:`LargeBodies`), JSON or not."""

    def __init__(self, app: ASGIApp, limits: Limits | None = None, refused_body_share: float = 1.0) -> None:
        self.app = app
        self.limits = limits
        self.large_bodies = LargeBodies(refused_body_share)
        self._pool: ThreadPoolExecutor | None = None  # one thread: large bodies are checked one at a time
        self.checked_off_loop = 0  # bodies checked in the helper thread (what the tests count)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        is_json = _is_json(scope)
        limits = self.limits if str(scope.get("path", "")).startswith(COUNTED_PREFIX) else None
        client = http_client(scope)
        declared = content_length(scope)
        loop = asyncio.get_running_loop()
        state = _Body()
        checked = False

        async def take_place() -> None:
            """This body is large: it takes its client's place (once free), or is refused 429 before it is
            read on."""
            refusal = await self.large_bodies.start(client)
            if refusal is not None:
                raise RefusedWhileReading(refusal)  # keep-alive: the server skips what is left of the body
            state.large = state.holds = True
            state.began = loop.time()  # its work starts now (not while it waited for the client's other body)

        def leave_place() -> None:
            if state.holds:
                state.holds = False
                self.large_bodies.done(client)

        async def checked_receive() -> Message:
            nonlocal checked
            if checked:
                return await receive()  # after the body: e.g. the disconnect watch
            if not state.large and declared is not None and declared > SMALL_BODY_BYTES:
                await take_place()
            if not is_json:  # passed on as it streams; only its size is watched
                message = await receive()
                state.left = message["type"] == "http.disconnect"
                if message["type"] == "http.request":
                    state.size += len(message.get("body", b""))
                    if not state.large and state.size > SMALL_BODY_BYTES:
                        await take_place()
                    if message.get("more_body", False):
                        return message
                checked = True
                leave_place()
                return message
            chunks: list[bytes] = []
            while True:
                message = await receive()  # the body guard's: size and time bounded there
                if message["type"] != "http.request":
                    checked = True
                    state.left = message["type"] == "http.disconnect"
                    leave_place()
                    return message
                chunk = message.get("body", b"")
                chunks.append(chunk)
                state.size += len(chunk)
                if not state.large and state.size > SMALL_BODY_BYTES:
                    await take_place()
                if not message.get("more_body", False):
                    break
            checked = True
            body = b"".join(chunks)
            problem = await self._check(body, limits)
            if problem is not None:
                # answered by the error table, in the JSON error shape; the place is left once the refusal is
                # answered (below), so that the client's next large body, waiting for it, meets the pause
                raise RefusedWhileReading(problem)
            leave_place()
            return {"type": "http.request", "body": body, "more_body": False}

        async def watched_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state.status = int(message["status"])
                state.answered = loop.time()
            await send(message)

        try:
            await self.app(scope, checked_receive, watched_send)
        finally:
            if state.large and not state.left and 400 <= state.status < 500 and state.status != 429:
                self.large_bodies.refused(client, state.status, state.answered - state.began)
            leave_place()

    async def _check(self, body: bytes, limits: Limits | None) -> ServiceError | None:
        if len(body) <= OFF_LOOP_BYTES:
            return problem_of(body, limits)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="safety-json")
        self.checked_off_loop += 1
        return await asyncio.get_running_loop().run_in_executor(self._pool, problem_of, body, limits)


def problem_of(body: bytes, limits: Limits | None = None) -> ServiceError | None:
    """Why ``body`` is refused before any route reads it, or None (also for text that is not JSON: the
    route says where it broke). ``limits``: check its counts too (:func:`check_counts`), first: a body past
    a count is refused after one parse by the C parser, before the slower duplicate-key reading."""
    if not body.strip():
        return None
    if limits is not None and (scanned := scan_counts(body, limits)) is not None:
        return scanned  # a huge request-level list: refused from the bytes, unparsed
    if json_input.too_deep(body):
        return MalformedJson(
            f"the body could not be read as JSON (nested deeper than {json_input.MAX_JSON_DEPTH} levels of "
            "objects and arrays)"
        )
    if limits is not None:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return None  # not JSON at all: the route says where it broke
        counted = check_counts(data, limits)
        del data
        if counted is not None:
            return counted
    try:
        json_input.loads(body)
    except json_input.DuplicateKey as exc:
        return MalformedJson(f"the body is ambiguous: {exc}; send each key once", code="duplicate_key")
    except json_input.TooDeep as exc:
        return MalformedJson(f"the body could not be read as JSON ({exc})")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # not JSON at all: the route says where it broke
    return None
