"""API-key authentication, checked before the request body is read.

A pure ASGI middleware: a request to a protected path (``/v1/*``, the admin endpoints, and the
API docs unless ``public_docs``) without the key gets 401 at once, so an unauthenticated client
can never make the service buffer or parse a body. The key is compared in constant time.
Without a configured key the admin endpoints (``/admin/*``: the hot swap; ``/break-it/api/admin/*``:
break-it rounds) are off, always 401; everything else is open. ``/health``, ``/ready``,
``/metrics`` and the break-it players' endpoints stay open. This module is the one place that
decides who may call what: the routers only declare the key's schemes in OpenAPI.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import Depends
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from dialogue_safety.breakit.api import ADMIN_PREFIX as BREAKIT_ADMIN_PREFIX
from dialogue_safety.service.errors import Unauthorized, error_response
from dialogue_safety.service.settings import ServiceSettings

log = logging.getLogger("dialogue_safety.service.auth")

API_PREFIX = "/v1/"
DOCS_PATHS = ("/docs", "/redoc", "/openapi.json")  # and everything under /docs and /redoc
ADMIN_PREFIX = "/admin"  # the hot swap (dialogue_safety/service/hot_swap.py mounts its router here)
# BREAKIT_ADMIN_PREFIX: break-it rounds (the prefix of the admin router of dialogue_safety/breakit/api.py)
ADMIN_PREFIXES = (ADMIN_PREFIX, BREAKIT_ADMIN_PREFIX)
ADMIN_OFF_MESSAGE = "admin endpoints are off: set SAFETY_API_KEY and send it as a bearer token or X-API-Key"

# Security schemes (used, and documented in OpenAPI, only when an API key is configured).
_bearer = HTTPBearer(auto_error=False, description="the API key as a bearer token")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the API key")
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
ApiKeyHeader = Annotated[str | None, Depends(_api_key_header)]


def api_key_of(settings: ServiceSettings) -> bytes | None:
    """The configured key (settings refuse an empty one), or None when authentication is off."""
    return settings.api_key.get_secret_value().encode() if settings.api_key is not None else None


def log_auth_state(settings: ServiceSettings) -> None:
    """Say at startup whether authentication is on and what it covers (never the key)."""
    if api_key_of(settings) is None:
        log.warning(
            "authentication is OFF: /v1/* and the API docs are open to anyone who can reach this port, "
            "the admin endpoints are off (set SAFETY_API_KEY to require a key)"
        )
    elif settings.public_docs:
        log.info("authentication is on for /v1/* and the admin endpoints; the API docs are public (SAFETY_PUBLIC_DOCS)")
    else:
        log.info("authentication is on for /v1/*, the admin endpoints and the API docs (/docs, /redoc, /openapi.json)")


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def is_admin(path: str) -> bool:
    return _under(path, ADMIN_PREFIXES)


def is_protected(path: str, public_docs: bool) -> bool:
    if path.startswith(API_PREFIX) or is_admin(path):
        return True
    if public_docs:
        return False
    return _under(path, DOCS_PATHS)


def key_matches(headers: Iterable[tuple[bytes, bytes]], api_key: bytes) -> bool:
    """Whether the request's headers carry ``api_key`` (:func:`supplied_key_in`), compared in constant
    time: the one key comparison (this middleware, and the server's admission from a request head)."""
    key = supplied_key_in(headers)
    return key is not None and hmac.compare_digest(key, api_key)


def supplied_key(scope: Scope) -> bytes | None:
    """The key from ``X-API-Key`` or ``Authorization: Bearer``, if any."""
    return supplied_key_in(scope["headers"])


def supplied_key_in(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """:func:`supplied_key` from the request's headers (lower-case names, as ASGI and uvicorn give them)."""
    bearer = None
    for name, value in headers:
        if name == b"x-api-key":
            return bytes(value)
        if name == b"authorization":
            scheme, _, token = bytes(value).partition(b" ")
            if scheme.lower() == b"bearer":
                bearer = token.strip()
    return bearer


class ApiKeyMiddleware:
    """Installed always: with ``api_key`` None it only turns the admin endpoints away."""

    def __init__(self, app: ASGIApp, api_key: bytes | None, public_docs: bool = False) -> None:
        self.app = app
        self.api_key = api_key
        self.public_docs = public_docs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal, close=True)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> Unauthorized | None:
        path = scope["path"]
        if self.api_key is None:
            return Unauthorized(ADMIN_OFF_MESSAGE) if is_admin(path) else None
        if is_protected(path, self.public_docs) and not key_matches(scope["headers"], self.api_key):
            return Unauthorized()
        return None


def api_key_declaration(settings: ServiceSettings) -> list[Any]:
    """Route dependencies that declare the API key's schemes in OpenAPI (for ``/v1/*`` and the
    admin routers); none when no key is set. They check nothing: :class:`ApiKeyMiddleware` checks the key,
    before the body is read."""
    if api_key_of(settings) is None:
        return []

    async def declare_api_key(credentials: BearerCredentials, key: ApiKeyHeader) -> None:
        """Declares the key's schemes in OpenAPI only (ApiKeyMiddleware checks the key)."""

    return [Depends(declare_api_key)]
