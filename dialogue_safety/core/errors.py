"""The errors a caller gets, whatever the front: what was wrong and what to fix, never a traceback.

Each has a machine-readable ``code``, a ``message`` that says what to fix, and the request
``field`` at fault. They are raised below the HTTP layer too: the item limits
(:mod:`dialogue_safety.core.limits`) raise :class:`InvalidInput`, which the corpus scorer writes
into a row's ``error``; the break-it game raises :class:`NotFound`, :class:`Conflict`,
:class:`Unauthenticated`, :class:`Forbidden`, :class:`RateLimited` and :class:`NotReady`. The
service's one error table (:mod:`dialogue_safety.service.errors`) maps these and its own HTTP
errors to statuses and the JSON error body.
"""

from __future__ import annotations

from collections.abc import Mapping


class ServiceError(Exception):
    """Base of the domain errors; ``code`` is machine-readable, the message says what to fix."""

    default_code = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.field = field
        self.headers = dict(headers or {})


class InvalidInput(ServiceError):
    """The request is well-formed JSON but breaks the schema or a limit."""

    default_code = "invalid_request"


class NotFound(ServiceError):
    """No such route, or the request names something that does not exist (a break-it round, task,
    attack or player)."""

    default_code = "not_found"


class Conflict(ServiceError):
    """The request breaks a rule of the current state (a finished task, a closed round, a duplicate)."""

    default_code = "conflict"


class Unauthenticated(ServiceError):
    """A break-it player endpoint without a valid player token."""

    default_code = "invalid_player_token"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field, headers={"WWW-Authenticate": 'Bearer realm="break-it player"'})


class Forbidden(ServiceError):
    """The caller is known but may not do this (a round without open sign-up)."""

    default_code = "forbidden"


class RateLimited(ServiceError):
    """A caller spent a rate limit (a break-it player or client address): retry after ``Retry-After`` s."""

    default_code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class NotReady(ServiceError):
    """The model is not loaded and warmed up yet, failed to load, or the service is stopping."""

    default_code = "not_ready"

    def __init__(
        self,
        message: str = "the model is not ready yet; retry later",
        *,
        code: str | None = None,
        retry_after_s: int = 1,
    ) -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after_s)})
