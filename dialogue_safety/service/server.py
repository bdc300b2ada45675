"""How uvicorn runs the app: connection limits, header and keep-alive timeouts, the access log.

uvicorn (0.54; pinned to that minor version in pyproject.toml, because the answers below that the
protocol writes itself go through its private request-cycle API: tests/test_uvicorn_contract.py fails
loudly when it changes)
neither caps open connections nor times out a connection that never finishes its request head, so
idle or slow clients could hold every file descriptor; its own settings (``limit_concurrency``,
``timeout_keep_alive``, ``h11_max_incomplete_event_size``) do not do what the protocol below does
(``python -m lab.experiments.uvicorn_settings``; lab/notes/runtime.md). In production a reverse proxy in front can do
this work instead (docs/api.md, "Behind a reverse proxy"). :func:`uvicorn_config`
builds the one configuration the CLI and the tests use, with a protocol class that

* at ``max_connections`` open connections (capped below the process's open-files limit,
  which it raises to the hard limit), makes room for a new connection by closing the one that
  has waited longest without sending a request head (idle clients go first; a connection in
  the middle of a request is never closed for this), or closes the new one when every
  connection is busy; both are logged (rate-limited);
* closes a connection that has not sent a complete request head ``header_timeout_s`` after it
  opened or after its previous response (idle and slowloris clients);
* refuses a request head (request line and headers) longer than ``max_header_bytes`` with 431, as
  soon as it is (never more than that and one read of the socket is held), and closes the
  connection: httptools itself has no limit, and 16 connections sending huge headers grew the
  process by 155 MB;
* answers what the HTTP parser cannot parse (a bad request line, header or chunk) in the service's
  JSON error shape (400 ``malformed_request``) instead of uvicorn's plain text: uvicorn sends all of
  them through the protocol's ``send_400_response``, overridden here;

an access-log filter that drops query strings; and the proxy headers (``X-Forwarded-For``,
``X-Forwarded-Proto``) trusted only from ``forwarded_allow_ips`` (off when unset). Memory (garbage
collector and allocator) tuning lives in :mod:`dialogue_safety.service.memory`; request bodies are guarded by
:class:`dialogue_safety.service.limits.BodyGuardMiddleware` (size, time, in-flight bytes); the 429 of an
overloaded service is the app's (:class:`dialogue_safety.service.admission.EarlyRefusalMiddleware`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from dialogue_safety.core.errors import ServiceError
from dialogue_safety.service.errors import HeaderTooLarge, MalformedRequest, error_response_bytes
from dialogue_safety.service.settings import ServiceSettings

log = logging.getLogger("dialogue_safety.service.server")
FD_RESERVE = 128  # descriptors kept for the model, logs, and the process itself
WARN_EVERY_S = 10.0


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard one; return the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(settings: ServiceSettings) -> int:
    """``max_connections``, lowered to fit the open-files limit (with a warning)."""
    limit = raise_open_files_limit()
    cap = min(settings.max_connections, max(1, limit - FD_RESERVE))
    if cap < settings.max_connections:
        log.warning(
            "max_connections %d lowered to %d: the open-files limit is %d (raise it with ulimit -n)",
            settings.max_connections,
            cap,
            limit,
        )
    return cap


class ConnectionGuard:
    """Shared by every connection of one server: the cap, the head timeout, refusal counts."""

    def __init__(
        self,
        max_connections: int,
        header_timeout_s: float,
        max_header_bytes: int | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes  # a request head's bytes at most (None: no limit)
        self.refused_heads = 0  # request heads refused: too long (431) or not HTTP (400)
        self.open = 0
        self.refused = 0
        self.evicted = 0
        self.timed_out = 0
        self.waiting: dict[Any, None] = {}  # connections waiting for a request head, oldest first
        self.activity = 0  # connections opened or closed and request heads received (memory.give_back_freed_memory)
        self.trimmer: asyncio.Task[None] | None = None
        self._last_warning = 0.0

    def admit(self) -> bool:
        if self.open >= self.max_connections:
            self._warn()
            if not self.waiting:
                self.refused += 1
                return False
            oldest = next(iter(self.waiting))
            self.evicted += 1
            oldest.evict()  # frees its slot at once
        self.open += 1
        return True

    def _warn(self) -> None:
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning(
                "connection limit reached: %d connections open (SAFETY_MAX_CONNECTIONS); so far %d idle "
                "connections closed to make room, %d new ones refused (all busy), %d closed for not sending a "
                "request head in %g s",
                self.open,
                self.evicted,
                self.refused,
                self.timed_out,
                self.header_timeout_s,
            )


def guarded_protocol(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the connection cap and the request-head timeout."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _admitted = False
        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0  # bytes received since the current request head began (while it is incomplete)
        _in_head = True  # a request head is (or may be) arriving: not between its end and its body's end

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            guard.activity += 1
            if not guard.admit():
                transport.abort()
                return
            self._admitted = True
            self._arm_head_timer()

        _running: Any = None  # the request cycle whose app runs now

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def connection_lost(self, exc: Exception | None) -> None:
            guard.activity += 1
            self._disarm_head_timer()
            self._release_slot()
            super().connection_lost(exc)
            # uvicorn tells only its newest request cycle, which is a pipelined request waiting its turn when the
            # client sent one before hanging up: the running request must hear it too (its items are dropped
            # before inference, its answer is not written to a closed connection)
            for cycle in (self._running, *(queued for queued, _ in self.pipeline)):
                if cycle is not None and not cycle.response_complete and not cycle.disconnected:
                    cycle.disconnected = True
                    cycle.message_event.set()

        def _release_slot(self) -> None:
            if self._admitted:
                self._admitted = False
                guard.open -= 1

        def evict(self) -> None:
            """Closed to make room for a new connection (it was waiting for a request head)."""
            self._disarm_head_timer()
            self._release_slot()
            self.transport.abort()

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            limit = guard.max_header_bytes
            if self._in_head and limit is not None and self._head_bytes > limit and not self.transport.is_closing():
                self._refuse_head(_head_too_large(limit))  # still incomplete, and already too long

        def on_message_begin(self) -> None:
            self._in_head = True
            super().on_message_begin()

        def on_message_complete(self) -> None:
            self._in_head, self._head_bytes = True, 0  # the next request's head counts from here
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            """What the parser cannot parse: the JSON error instead of uvicorn's plain text (``msg``)."""
            self._refuse_head(
                MalformedRequest(
                    "the request is not valid HTTP/1.1 (its request line, a header, or the chunked body); "
                    "the connection is closed"
                )
            )

        def _refuse_head(self, refusal: ServiceError) -> None:
            """Answer ``refusal`` and close the connection (what follows on it is not read)."""
            guard.refused_heads += 1
            self._disarm_head_timer()
            self._in_head = False
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                self.cycle = _ANSWERED  # type: ignore[assignment]  # uvicorn skips what the parser still sees
            elif not cycle.response_started:  # a body that broke the parser: its request gets no other answer
                cycle.disconnected = True  # what the app still sends is dropped; its body reads end
                cycle.message_event.set()
            else:  # never inside a response already begun
                self.transport.close()
                return
            self.transport.write(error_response_bytes(refusal, self.server_state.default_headers, keep_alive=False))
            self.transport.close()

        def on_headers_complete(self) -> None:
            guard.activity += 1
            self._disarm_head_timer()
            self._in_head = False
            limit = guard.max_header_bytes
            if limit is not None and len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers) > limit:
                self._refuse_head(_head_too_large(limit))  # complete, but too long (it came in one read)
                return
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                self._arm_head_timer()  # the next request's head must come in time too

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self._head_timer = self.loop.call_later(guard.header_timeout_s, self._head_timed_out)
            guard.waiting[self] = None

        def _disarm_head_timer(self) -> None:
            guard.waiting.pop(self, None)
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            guard.waiting.pop(self, None)
            if not self.transport.is_closing():
                guard.timed_out += 1
                self.transport.close()

    return GuardedHttpToolsProtocol


def _head_too_large(limit: int) -> HeaderTooLarge:
    return HeaderTooLarge(
        f"the request head (request line and headers) is longer than {limit} bytes (SAFETY_MAX_HEADER_BYTES); "
        "send shorter headers; the connection is closed"
    )


class _AnsweredCycle:
    """Stands in for uvicorn's request cycle of a request the protocol answered itself (complete)."""

    response_complete = True
    disconnected = False
    keep_alive = True

    class message_event:  # noqa: N801  # uvicorn calls cycle.message_event.set()
        @staticmethod
        def set() -> None:
            pass


_ANSWERED = _AnsweredCycle()


class DropQueryString(logging.Filter):
    """uvicorn's access log without query strings (they may hold tokens or texts)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def uvicorn_config(app: Any, settings: ServiceSettings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration the service runs under (``overrides`` for tests: port, log level)."""
    guard = ConnectionGuard(connection_cap(settings), settings.header_timeout_s, settings.max_header_bytes)
    logging.getLogger("uvicorn.access").addFilter(DropQueryString())
    options: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        workers=1,
        http=guarded_protocol(guard),
        ws="none",  # no WebSocket routes: a handshake is an ordinary request (a JSON 4xx, not a bare 403)
        log_level=settings.log_level,
        access_log=settings.access_log,
        # X-Forwarded-For / -Proto from the configured proxies only (the client address of rate limits and logs)
        proxy_headers=settings.forwarded_allow_ips is not None,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        server_header=False,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    options.update(overrides)
    config = uvicorn.Config(app, **options)
    config.connection_guard = guard  # type: ignore[attr-defined]  # for tests and the abuse benchmark
    return config
