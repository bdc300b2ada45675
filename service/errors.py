"""The one error table: domain exceptions → HTTP status and a JSON body that says what to fix.

Every error the service returns has the same shape::

    {"error": {"code": "utterance_too_long", "message": "what to fix", "field": "items[3].utterance"}}

The service raises the domain exceptions below (from the limits, the batcher, the API);
:func:`install_error_handlers` maps them — and FastAPI's own validation and HTTP errors — into
that shape in one place. Error bodies never echo request texts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

log = logging.getLogger("service.errors")


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


class MalformedJson(ServiceError):
    default_code = "malformed_json"


class UnsupportedMediaType(ServiceError):
    default_code = "unsupported_media_type"


class PayloadTooLarge(ServiceError):
    default_code = "payload_too_large"


class Unauthorized(ServiceError):
    default_code = "unauthorized"

    def __init__(
        self, message: str = "missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
    ) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class NotFound(ServiceError):
    """The request names something that does not exist (a break-it round, task, attack or player)."""

    default_code = "not_found"


class Conflict(ServiceError):
    """The request breaks a rule of the current state (a finished task, a closed round, a duplicate)."""

    default_code = "conflict"


class Overloaded(ServiceError):
    """The bounded queue is full: the caller should back off and retry."""

    default_code = "overloaded"

    def __init__(self, message: str = "the service is overloaded; retry later", *, retry_after_s: int = 1) -> None:
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


class InferenceFailed(ServiceError):
    """The inference batch this request was part of failed; other batches are unaffected."""

    default_code = "inference_failed"

    def __init__(
        self,
        message: str = "inference failed for the batch holding this request; "
        "the service keeps running, retry the request",
    ) -> None:
        super().__init__(message)


class ErrorInfo(BaseModel):
    code: str = Field(description="machine-readable error code", examples=["utterance_too_long"])
    message: str = Field(description="what went wrong and what to fix")
    field: str | None = Field(None, description="the request field at fault, e.g. items[3].utterance")


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorInfo


@dataclass(frozen=True)
class ErrorRow:
    exception: type[ServiceError]
    status: int
    when: str


# THE table. Order matters only for documentation; lookup follows the exception's MRO.
ERROR_TABLE: tuple[ErrorRow, ...] = (
    ErrorRow(MalformedJson, 400, "the body is not valid JSON"),
    ErrorRow(Unauthorized, 401, "an API key is configured and the request lacks it"),
    ErrorRow(PayloadTooLarge, 413, "the body is larger than max_body_bytes (Content-Length or streamed)"),
    ErrorRow(NotFound, 404, "a break-it round, task, attack or player that does not exist"),
    ErrorRow(Conflict, 409, "a break-it game rule or a concurrent write refused the request"),
    ErrorRow(UnsupportedMediaType, 415, "the body is not sent as application/json"),
    ErrorRow(InvalidInput, 422, "schema violation or a request limit (see service/limits.py)"),
    ErrorRow(Overloaded, 429, "the inference queue is full (Retry-After says when to retry)"),
    ErrorRow(InferenceFailed, 500, "the inference batch holding this request failed"),
    ErrorRow(NotReady, 503, "model not loaded/warmed up yet, failed to load, or shutting down"),
)
_STATUS: dict[type[ServiceError], int] = {row.exception: row.status for row in ERROR_TABLE}
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def status_of(exc: ServiceError) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}


def error_response(exc: ServiceError) -> JSONResponse:
    return JSONResponse(
        error_body(exc.code, exc.message, exc.field), status_code=status_of(exc), headers=exc.headers or None
    )


def format_loc(loc: Sequence[Any]) -> str | None:
    """``("body", "items", 3, "object", "utterance")`` → ``"items[3].utterance"``."""
    parts = list(loc)
    if parts and parts[0] in {"body", "query", "path", "header"}:
        parts = parts[1:]
    out = ""
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i > 0 and isinstance(parts[i - 1], int) and part in {"object", "string"}:
            continue  # a tagged-union branch name, not a field
        else:
            out += f".{part}" if out else str(part)
    return out or None


def from_validation_error(exc: RequestValidationError) -> ServiceError:
    """Turn FastAPI's validation error into ours (its first error is reported; inputs never echoed)."""
    errors = exc.errors()
    if not errors:
        return InvalidInput("the request does not match the schema")
    first = errors[0]
    kind = str(first.get("type", ""))
    loc = tuple(first.get("loc", ()))
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return MalformedJson(f"the body is not valid JSON ({detail}); send a JSON object".replace(" ()", ""))
    if loc == ("body",) and isinstance(first.get("input"), bytes | bytearray):
        return UnsupportedMediaType("send the body as JSON with 'Content-Type: application/json'")
    field = format_loc(loc)
    message = str(first.get("msg", "invalid value"))
    code = "invalid_request"
    if field and field.split(".")[-1] == "threshold":
        code = "invalid_threshold"
        message = "threshold must be a number in [0, 1]"
    elif kind == "missing":
        message = f"{field} is required"
    elif field:
        message = f"{field}: {message}"
    extra = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    return InvalidInput(message + extra, code=code, field=field)


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(exc)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(from_validation_error(exc))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 413:
        return error_response(
            PayloadTooLarge(
                "the request body is too large (SAFETY_MAX_BODY_BYTES): send fewer or shorter items per request"
            )
        )
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return JSONResponse(
        error_body(code, str(exc.detail)), status_code=exc.status_code, headers=dict(exc.headers or {}) or None
    )


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Log the traceback (code locations, no request body); answer without any detail.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body("internal_error", "internal error; see the server logs"), status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
