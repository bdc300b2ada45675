"""How uvicorn runs the app: connection limits, header and keep-alive timeouts, the access log.

uvicorn (pinned to one minor version in pyproject.toml, because the protocol class below subclasses
its httptools protocol: tests/test_uvicorn_contract.py fails loudly when what it relies on changes)
neither caps open connections nor times out a connection that never finishes its request head, so
idle or slow clients could hold every file descriptor. In production a reverse proxy in front can do
this work instead (docs/api.md, "Behind a reverse proxy"). :func:`uvicorn_config`
builds the one configuration the CLI and the tests use, with a protocol class that

* at ``max_connections`` open connections (capped below the process's open-files limit,
  which it raises to the hard limit), makes room for a new connection by closing the one that
  has waited longest without sending a request head (idle clients go first; a connection in
  the middle of a request is never closed for this), or closes the new one when every
  connection is busy; both are logged (rate-limited);
* closes a connection that has not sent a complete request head ``header_timeout_s`` after it
  opened or after its previous response (idle and slowloris clients);

and an access-log filter that drops query strings. Memory (garbage collector and allocator) tuning
lives in :mod:`dialogue_safety.service.memory`; request bodies are guarded by
:class:`dialogue_safety.service.limits.BodyGuardMiddleware` (size, time, in-flight bytes); the 429 of an
overloaded service is the app's (:class:`dialogue_safety.service.app.EarlyRefusalMiddleware`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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

    def __init__(self, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
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

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            guard.activity += 1
            if not guard.admit():
                transport.abort()
                return
            self._admitted = True
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            guard.activity += 1
            self._disarm_head_timer()
            self._release_slot()
            super().connection_lost(exc)

        def _release_slot(self) -> None:
            if self._admitted:
                self._admitted = False
                guard.open -= 1

        def evict(self) -> None:
            """Closed to make room for a new connection (it was waiting for a request head)."""
            self._disarm_head_timer()
            self._release_slot()
            self.transport.abort()

        def on_headers_complete(self) -> None:
            guard.activity += 1
            self._disarm_head_timer()
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


class DropQueryString(logging.Filter):
    """uvicorn's access log without query strings (they may hold tokens or texts)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def uvicorn_config(app: Any, settings: ServiceSettings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration the service runs under (``overrides`` for tests: port, log level)."""
    guard = ConnectionGuard(connection_cap(settings), settings.header_timeout_s)
    logging.getLogger("uvicorn.access").addFilter(DropQueryString())
    options: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        workers=1,
        http=guarded_protocol(guard),
        log_level=settings.log_level,
        access_log=settings.access_log,
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    options.update(overrides)
    config = uvicorn.Config(app, **options)
    config.connection_guard = guard  # type: ignore[attr-defined]  # for tests and the abuse benchmark
    return config
