"""API-key authentication, checked before the request body is read.

A pure ASGI middleware: a request to a protected path (``/v1/*``, and the API docs unless
``public_docs``) without the key gets 401 at once, so an unauthenticated client can never make
the service buffer or parse a body. The key is compared in constant time. ``/health``,
``/ready`` and ``/metrics`` stay open for probes and scrapers.
"""

from __future__ import annotations

import hmac
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import Unauthorized, error_response
from service.settings import ServiceSettings

log = logging.getLogger("service.auth")

API_PREFIX = "/v1/"
DOCS_PATHS = ("/docs", "/redoc", "/openapi.json")  # and everything under /docs and /redoc


def api_key_of(settings: ServiceSettings) -> bytes | None:
    """The configured key (settings refuse an empty one), or None when authentication is off."""
    return settings.api_key.get_secret_value().encode() if settings.api_key is not None else None


def log_auth_state(settings: ServiceSettings) -> None:
    """Say at startup whether authentication is on and what it covers (never the key)."""
    if api_key_of(settings) is None:
        log.warning(
            "authentication is OFF: /v1/* and the API docs are open to anyone who can reach this port "
            "(set SAFETY_API_KEY to require a key)"
        )
    elif settings.public_docs:
        log.info("authentication is on for /v1/*; the API docs are public (SAFETY_PUBLIC_DOCS)")
    else:
        log.info("authentication is on for /v1/* and the API docs (/docs, /redoc, /openapi.json)")


def is_protected(path: str, public_docs: bool) -> bool:
    if path.startswith(API_PREFIX):
        return True
    if public_docs:
        return False
    return any(path == p or path.startswith(p + "/") for p in DOCS_PATHS)


def supplied_key(scope: Scope) -> bytes | None:
    """The key from ``X-API-Key`` or ``Authorization: Bearer``, if any."""
    bearer = None
    for name, value in scope["headers"]:
        if name == b"x-api-key":
            return bytes(value)
        if name == b"authorization":
            scheme, _, token = bytes(value).partition(b" ")
            if scheme.lower() == b"bearer":
                bearer = token.strip()
    return bearer


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: bytes, public_docs: bool = False) -> None:
        self.app = app
        self.api_key = api_key
        self.public_docs = public_docs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_protected(scope["path"], self.public_docs):
            key = supplied_key(scope)
            if key is None or not hmac.compare_digest(key, self.api_key):
                await error_response(Unauthorized(), close=True)(scope, receive, send)
                return
        await self.app(scope, receive, send)
