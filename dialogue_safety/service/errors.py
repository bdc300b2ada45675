"""The one error table: domain exceptions → HTTP status and a JSON body that says what to fix.

Every error the service returns has the same shape::

    {"error": {"code": "utterance_too_long", "message": "what to fix", "field": "items[3].utterance"}}

The service raises the domain exceptions (:mod:`dialogue_safety.core.errors`, and the HTTP ones below)
from the limits, the batcher, the API;
:func:`install_error_handlers` maps them — and FastAPI's own validation and HTTP errors — into
that shape in one place. Error bodies never echo request texts.

``/v1/moderations`` (:data:`OPENAI_ERROR_PATHS`) speaks OpenAI's error shape instead,
``{"error": {"message", "type", "param", "code"}}`` (``code`` ours, ``param`` the field at fault), and
answers 400 where the table says 422, as OpenAI answers an invalid request: every error answer is made by
:func:`error_response`, whoever refuses (a route, request validation, the API key check, the body guard,
admission), and takes that shape when it is sent on such a path.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from dialogue_safety.core.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    NotReady,
    RateLimited,
    ServiceError,
    Unauthenticated,
)
from dialogue_safety.core.limits import NOT_TEXT_MESSAGE
from dialogue_safety.service.log_values import printable

log = logging.getLogger("dialogue_safety.service.errors")


class MalformedJson(ServiceError):
    default_code = "malformed_json"


class MalformedRequest(ServiceError):
    """What the HTTP parser cannot parse (answered by the server's protocol, the connection closed)."""

    default_code = "malformed_request"


class HeaderTooLarge(ServiceError):
    """A request head over ``max_header_bytes`` (answered by the server's protocol, the connection closed)."""

    default_code = "header_too_large"


class UnsupportedMediaType(ServiceError):
    default_code = "unsupported_media_type"


class PayloadTooLarge(ServiceError):
    default_code = "payload_too_large"


class RequestTooCostly(PayloadTooLarge):
    """One request's work is more than admission ever admits at once (:mod:`dialogue_safety.service.admission`)."""

    default_code = "request_too_costly"


class RequestTimeout(ServiceError):
    """The request body did not arrive in time (slow, stalled, or shorter than its Content-Length)."""

    default_code = "request_timeout"


class Unauthorized(ServiceError):
    default_code = "unauthorized"

    def __init__(
        self, message: str = "missing or wrong API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"
    ) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Overloaded(ServiceError):
    """Admission refused the work (its lane is full, the client holds its fair share, or unfinished
    bodies fill their buffer): the caller should back off and retry."""

    default_code = "overloaded"

    def __init__(self, message: str = "the service is overloaded; retry later", *, retry_after_s: int = 1) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class InferenceFailed(ServiceError):
    """The inference batch this request was part of failed; other batches are unaffected."""

    default_code = "inference_failed"

    def __init__(
        self,
        message: str = "inference failed for the batch holding this request; "
        "the service keeps running, retry the request",
    ) -> None:
        super().__init__(message)


class MethodNotAllowed(ServiceError):
    default_code = "method_not_allowed"


class InternalError(ServiceError):
    """A bug: the details go to the server log, never into the response."""

    default_code = "internal_error"


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
    codes: tuple[str, ...] = ()  # every ``code`` this exception is raised with (default: its default_code)

    @property
    def all_codes(self) -> tuple[str, ...]:
        return self.codes or (self.exception.default_code,)


# THE table: every status and code the service answers with (docs/api.md reproduces it; a test
# holds the doc to it). Order matters only for documentation; lookup follows the exception's MRO.
ERROR_TABLE: tuple[ErrorRow, ...] = (
    ErrorRow(
        MalformedJson,
        400,
        "the body is not valid UTF-8 JSON, nests too deeply, or holds an object with a key twice",
        ("malformed_json", "duplicate_key"),
    ),
    ErrorRow(MalformedRequest, 400, "the request is not valid HTTP/1.1 (request line, header, chunked body)"),
    ErrorRow(Unauthorized, 401, "an API key is configured and the request lacks it or has a wrong one"),
    ErrorRow(Unauthenticated, 401, "a break-it player endpoint without a valid player token (X-Player-Token)"),
    ErrorRow(Forbidden, 403, "break-it sign-up on a round where the organiser has turned it off (invites only)"),
    ErrorRow(NotFound, 404, "no such route, or a break-it round, task, attack or player that does not exist"),
    ErrorRow(MethodNotAllowed, 405, "e.g. GET /v1/classify"),
    ErrorRow(RequestTimeout, 408, "the body did not arrive within body_timeout_s (the connection is closed)"),
    ErrorRow(Conflict, 409, "a break-it game rule or a concurrent write refused the request"),
    ErrorRow(
        PayloadTooLarge,
        413,
        "the body is larger than max_body_bytes (Content-Length or streamed), or the request's work is more than "
        "half its admission lane (max_pending_tokens, max_explain_tokens)",
        ("payload_too_large", "request_too_costly"),
    ),
    ErrorRow(UnsupportedMediaType, 415, "a Content-Type other than JSON, or a Content-Encoding (gzip...)"),
    ErrorRow(HeaderTooLarge, 431, "the request head is longer than max_header_bytes (the connection is closed)"),
    ErrorRow(
        InvalidInput,
        422,
        "schema violation or a request limit (see dialogue_safety/core/limits.py)",
        (
            "invalid_request",
            "unknown_field",
            "invalid_item",
            "invalid_threshold",
            "empty_utterance",
            "invalid_text",
            "utterance_too_long",
            "too_many_history_turns",
            "turn_too_long",
            "too_many_windows",
            "too_many_items",
            "empty_batch",
            "model_refused",
            "invalid_message",
            "unsupported_content",
            "policy_refused",
        ),
    ),
    ErrorRow(
        Overloaded,
        429,
        "the admission lane, the client's fair share of it, or the body buffer is full (Retry-After: when to retry)",
    ),
    ErrorRow(RateLimited, 429, "a break-it player or client address spent a rate limit of the round (Retry-After)"),
    ErrorRow(InferenceFailed, 500, "the inference batch holding this request failed"),
    ErrorRow(InternalError, 500, "a bug; details in the server log, never in the response"),
    ErrorRow(
        NotReady,
        503,
        "model not loaded/warmed up yet, failed to load, or shutting down",
        ("not_ready", "model_failed", "shutting_down"),
    ),
)
_STATUS: dict[type[ServiceError], int] = {row.exception: row.status for row in ERROR_TABLE}
_HTTP_ERRORS: dict[int, type[ServiceError]] = {404: NotFound, 405: MethodNotAllowed}


CLIENT_CLOSED = 499  # nginx's "client closed request": the caller left, nobody reads the answer
MODERATIONS_PATH = "/v1/moderations"
#: the paths whose errors are answered in OpenAI's shape (and 422 as 400)
OPENAI_ERROR_PATHS = frozenset({MODERATIONS_PATH})
#: OpenAI's error ``type`` by HTTP status (anything else: invalid_request_error)
OPENAI_ERROR_TYPES: dict[int, str] = {429: "requests", 500: "server_error", 503: "server_error"}


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorResponse(BaseModel):
    error: OpenAIError


def openapi_responses(model: type[BaseModel], *, openai: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the API routes, generated from :data:`ERROR_TABLE` (one entry per
    status; rows sharing a status are joined); ``openai``: as the paths of :data:`OPENAI_ERROR_PATHS`
    answer them (422 as 400)."""
    whens: dict[int, list[str]] = {}
    for row in ERROR_TABLE:
        whens.setdefault(400 if openai and row.status == 422 else row.status, []).append(row.when)
    return {status: {"model": model, "description": "; ".join(w)} for status, w in sorted(whens.items())}


#: the error responses of every API route in OpenAPI (the service adds them to the routers it mounts)
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = openapi_responses(ErrorResponse)
OPENAI_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = openapi_responses(OpenAIErrorResponse, openai=True)


def status_of(exc: ServiceError) -> int:
    for cls in type(exc).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]
    return 500


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}


def openai_error(status: int, body: dict[str, Any]) -> dict[str, Any]:
    """The service's error body (``{"error": {"code", "message", "field"}}``) in OpenAI's shape."""
    found = body.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    return {
        "error": {
            "message": str(error.get("message", "")),
            "type": OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": error.get("field"),
            "code": error.get("code"),
        }
    }


class ErrorAnswer(JSONResponse):
    """An error answer: the service's JSON error body, or OpenAI's shape (422 as 400) when it is sent on a
    path of :data:`OPENAI_ERROR_PATHS` (decided when it is sent, from the request's path)."""

    def __init__(self, content: dict[str, Any], status_code: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(content, status_code=status_code, headers=headers)
        self.content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("path") in OPENAI_ERROR_PATHS:
            self.status_code = 400 if self.status_code == 422 else self.status_code
            self.body = self.render(openai_error(self.status_code, self.content))
            self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
            self.raw_headers.append((b"content-length", str(len(self.body)).encode("latin-1")))
        await super().__call__(scope, receive, send)


def error_response(exc: ServiceError, *, close: bool = False) -> JSONResponse:
    """The JSON error response for ``exc`` (:class:`ErrorAnswer`); ``close`` also ends the connection (for
    answers sent before the body was read: what is left of it is never read)."""
    headers = dict(exc.headers)
    if close:
        headers["Connection"] = "close"
    return ErrorAnswer(error_body(exc.code, exc.message, exc.field), status_of(exc), headers or None)


def error_response_bytes(
    exc: ServiceError, default_headers: Sequence[tuple[bytes, bytes]] = (), *, keep_alive: bool = True
) -> bytes:
    """:func:`error_response` as the bytes of an HTTP/1.1 response (the same status, headers and JSON
    body), for answers the server writes itself before any ASGI app runs (:mod:`dialogue_safety.service.server`:
    a request head too long, or one the parser cannot read). ``default_headers``: the server's own (``date``)."""
    body = json.dumps(error_body(exc.code, exc.message, exc.field), ensure_ascii=False, separators=(",", ":")).encode()
    status = status_of(exc)
    reason = HTTPStatus(status).phrase.encode()
    lines = [b"HTTP/1.1 %d %s" % (status, reason)]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [b"content-type: application/json", b"content-length: %d" % len(body)]
    lines += [f"{name.lower()}: {value}".encode("latin-1") for name, value in exc.headers.items()]
    if not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class RefusedWhileReading(StarletteHTTPException):
    """A :class:`ServiceError` raised while the body streams in (by the ASGI guards in
    :mod:`dialogue_safety.service.limits`); an HTTPException so that FastAPI's body reader lets it through to the
    error table, which answers ``error`` in the JSON error shape."""

    def __init__(self, error: ServiceError, *, close: bool = False) -> None:
        super().__init__(status_code=status_of(error), detail=error.message)
        self.error = error
        self.close = close


#: the names pydantic gives the branches of a union in an error's location (``messages[1].content.str``): its
#: own path, never a field the client wrote
_TYPE_BRANCHES = frozenset({"str", "int", "float", "bool", "bytes", "none", "dict", "list", "tuple", "set"})
_BRANCH_MARKS = ("[", "-", ",", "'", " ")


def _is_branch(part: str) -> bool:
    """A part of pydantic's location that names a validator or a union branch, not a field."""
    return part in _TYPE_BRANCHES or any(mark in part for mark in _BRANCH_MARKS)


def format_loc(loc: Sequence[Any]) -> str | None:
    """The field as the client wrote it: ``("body", "items", 3, "object", "utterance")`` → ``"items[3].utterance"``,
    ``("body", "messages", 1, "content", "list[dict[str,any]]")`` → ``"messages[1].content"``."""
    parts = list(loc)
    if parts and parts[0] in {"body", "query", "path", "header"}:
        parts = parts[1:]
    out = ""
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i > 0 and isinstance(parts[i - 1], int) and part in {"object", "string"}:
            continue  # a tagged-union branch name, not a field
        elif isinstance(part, str) and _is_branch(part):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or None


def _first(errors: Sequence[Any]) -> Any:
    """The error to report: an unknown field first (a misspelt name also makes its field missing;
    the typo is what the client must fix), else the first."""
    return next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])


def _unknown_field(
    error: Any, errors: Sequence[Any], field: str | None, known: Collection[str]
) -> tuple[str, Any | None]:
    """``unknown field 'utterence'; did you mean 'utterance'?`` (the suggestion from the fields missing
    beside it, then the known field names; never the name sent, which may be a field of another request,
    e.g. ``text`` of a history turn sent to /v1/classify), and the missing-field error the typo explains (if any)."""
    loc = tuple(error.get("loc", ()))
    name = str(loc[-1]) if loc else ""
    missing = {str(e["loc"][-1]): e for e in errors if e.get("type") == "missing" and tuple(e["loc"][:-1]) == loc[:-1]}
    candidates = [f for f in sorted(missing) + sorted(set(known) - set(missing)) if f != name]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    message = f"unknown field '{field or name}'" + (f"; did you mean '{close[0]}'?" if close else "")
    return message, missing.get(close[0]) if close else None


def from_validation_error(exc: RequestValidationError, known_fields: Collection[str] = ()) -> ServiceError:
    """Turn FastAPI's validation error into ours (one error is reported, an unknown field first; inputs
    never echoed). ``known_fields``: the request models' field names, to suggest for an unknown one."""
    errors = exc.errors()
    if not errors:
        return InvalidInput("the request does not match the schema")
    return from_errors(errors, known_fields)


def from_errors(errors: Sequence[Any], known_fields: Collection[str] = (), prefix: str = "") -> ServiceError:
    """:func:`from_validation_error` for pydantic's list of errors (``prefix``: where the validated
    value sits in the request, e.g. ``items[3].`` for a batch item validated on its own)."""
    first = _first(errors)
    kind = str(first.get("type", ""))
    loc = tuple(first.get("loc", ()))
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return MalformedJson(f"the body is not valid JSON ({detail}); send a JSON object".replace(" ()", ""))
    if loc == ("body",) and isinstance(first.get("input"), bytes | bytearray):
        return UnsupportedMediaType("send the body as JSON with 'Content-Type: application/json'")
    if loc == ("body",) and kind == "missing":
        return InvalidInput("the request body is empty; send a JSON object (see /docs)")
    field = format_loc(loc)
    if prefix:
        field = prefix.rstrip(".") + ("" if not field else field if field.startswith("[") else "." + field)
    if kind == "string_unicode":  # pydantic's word for a lone surrogate in a constrained string
        return InvalidInput(NOT_TEXT_MESSAGE, code="invalid_text", field=field)
    message = str(first.get("msg", "invalid value"))
    code = "invalid_request"
    explained = None
    if kind == "extra_forbidden":
        code = "unknown_field"
        message, explained = _unknown_field(first, errors, field, known_fields)
    elif field and field.split(".")[-1] == "threshold":
        code = "invalid_threshold"
        message = "threshold must be a number in [0, 1]"
    elif kind == "missing":
        message = f"{field} is required"
    elif field:
        message = f"{field}: {message}"
    # a missing field the typo explains is not one more; nor are the other branches of a union on the same field
    others = [e for e in errors if e is not first and e is not explained]
    more = len({format_loc(tuple(e.get("loc", ()))) for e in others} - {format_loc(loc)})
    extra = f" (and {more} more error(s))" if more > 0 else ""
    return InvalidInput(message + extra, code=code, field=field)


async def _service_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(exc)


def _validation_error(known_fields: Collection[str]) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(from_validation_error(exc, known_fields))

    return handle


# FastAPI's answer when the body bytes cannot be decoded at all (not UTF-8, nesting too deep...).
_UNPARSABLE_BODY = "There was an error parsing the body"


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if isinstance(exc, RefusedWhileReading):
        return error_response(exc.error, close=exc.close)
    if isinstance(exc.__cause__, ClientDisconnect):  # the body never came whole: the caller left, nobody reads this
        return Response(status_code=CLIENT_CLOSED)
    if exc.status_code == 400 and exc.detail == _UNPARSABLE_BODY:
        cause = exc.__cause__
        why = "nested too deeply" if isinstance(cause, RecursionError) else "not UTF-8 JSON"
        return error_response(
            MalformedJson(f"the body could not be read as JSON ({why}); send a UTF-8 encoded, uncompressed JSON object")
        )
    if exc.status_code == 413:
        return error_response(
            PayloadTooLarge(
                "the request body is too large (SAFETY_MAX_BODY_BYTES): send fewer or shorter items per request"
            )
        )
    known = _HTTP_ERRORS.get(exc.status_code)
    if known is not None:
        error = known(str(exc.detail), headers=exc.headers)
        return error_response(error)
    return ErrorAnswer(error_body("http_error", str(exc.detail)), exc.status_code, dict(exc.headers or {}) or None)


async def _unexpected(request: Request, exc: Exception) -> Response:
    # Log the traceback (code locations, no request body); answer without any detail.
    log.error("unexpected error on %s %s", request.method, printable(request.url.path), exc_info=exc)
    return error_response(InternalError("internal error; see the server logs"))


def install_error_handlers(app: FastAPI, known_fields: Collection[str] = ()) -> None:
    """The one error table on ``app``; ``known_fields``: the field names of its request models (an
    unknown field is answered with the closest of them)."""
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(RequestValidationError, _validation_error(frozenset(known_fields)))
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
