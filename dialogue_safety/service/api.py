"""The HTTP API: a thin FastAPI shell over the micro-batcher and the ONNX classifier.

``create_app(settings)`` builds everything (settings, metrics registry, limits, routes); the
lifespan loads and warms up the model in a thread, then starts the batcher: ``/health``
answers at once, ``/ready`` and ``/v1/*`` answer 503 until the model is warm. Errors go
through the one table in :mod:`dialogue_safety.service.errors`. Texts are never logged unless
``log_texts`` is set.

Run it with ``dialogue-safety serve`` or ``uvicorn --factory dialogue_safety.service.api:create_app``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi_offline import FastAPIOffline
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from dialogue_safety.breakit import api as breakit_api
from dialogue_safety.core import explain
from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import Limits
from dialogue_safety.core.model_card import public_card
from dialogue_safety.core.schema import Example, Prediction, Turn
from dialogue_safety.service.auth import ApiKeyMiddleware, api_key_declaration, api_key_of, log_auth_state
from dialogue_safety.service.batcher import Announcement
from dialogue_safety.service.errors import (
    ERROR_RESPONSES,
    ErrorInfo,
    ErrorResponse,
    error_body,
    error_response,
    from_errors,
    install_error_handlers,
)
from dialogue_safety.service.hot_swap import ModelSwapper, admin_router
from dialogue_safety.service.limits import BodyGuardMiddleware, apply_to_openapi
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import (
    ANNOUNCEMENT,
    ClassifierFactory,
    ServedModel,
    ServiceState,
    load_onnx_classifier,
)
from dialogue_safety.service.telemetry import RequestMetricsMiddleware

log = logging.getLogger("dialogue_safety.service.api")
HEALTH_PATH = "/health"  # liveness: answered without the model (the HTTP benchmarks' floor)
CLIENT_CLOSED = 499  # nginx's "client closed request": the caller left, nobody reads the answer


# -- request and response schemas ---------------------------------------------------------------
def _object_or_string(value: Any) -> str:
    return "string" if isinstance(value, str) else "object"


class TurnIn(BaseModel):
    """One turn of dialogue history."""

    model_config = ConfigDict(extra="forbid")
    speaker: str | None = Field(None, max_length=64, strict=True, description="free text: user, bot, P1...")
    text: str = Field(strict=True, description="what was said")


HistoryEntry = Annotated[
    Annotated[TurnIn, Tag("object")] | Annotated[str, Tag("string")], Discriminator(_object_or_string)
]
Threshold = Annotated[
    float | None,
    Field(
        ge=0.0,
        le=1.0,
        strict=True,  # a number: not true/false, not "0.5"
        description="decision threshold for this request (default: the model's)",
    ),
]


class DialogueItem(BaseModel):
    """The utterance to judge and the dialogue before it (oldest turn first)."""

    model_config = ConfigDict(extra="forbid")
    history: list[HistoryEntry] = Field(
        default_factory=list, description="earlier turns, oldest first: objects {speaker, text} or strings"
    )
    utterance: str = Field(strict=True, description="the message to classify, judged in the context of the history")
    threshold: Threshold = None


class ClassifyRequest(DialogueItem):
    """One dialogue item, optionally with a word-level explanation of its score."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "history": [
                        {"speaker": "user", "text": "what do you think of my neighbours?"},
                        {"speaker": "bot", "text": "I don't know them. What are they like?"},
                    ],
                    "utterance": "they should all be thrown out of the country",
                },
                {"history": ["hi!", "hello, how are you?"], "utterance": "great, thanks", "threshold": 0.7},
                {"utterance": "you are a clown", "explain": True},
            ]
        },
    )
    explain: bool = Field(
        False,
        strict=True,
        description="add per-word contributions to the score (Shapley values by default; see explain_method)",
    )
    explain_history: bool = Field(False, strict=True, description="with explain: explain the history turns' words too")
    explain_method: Literal["shapley", "occlusion"] = Field(
        "shapley",
        description="with explain: shapley (sees redundant words: both insults of 'stupid idiot' count) or "
        "occlusion (leave one word out; cheaper for a few words)",
    )


class InvalidItem:
    """A batch item that is not a string or a dialogue item object (another type, an unknown or
    missing field...): it gets an error in its own slot, as an item that breaks a limit does."""

    __slots__ = ("errors",)

    def __init__(self, errors: list[Any]) -> None:
        self.errors = errors

    def error(self, prefix: str) -> InvalidInput:
        roots = [e for e in self.errors if tuple(e.get("loc", ()))[1:] == ()]  # the item itself, not a field
        if roots and len(roots) == len(self.errors):
            got = _json_type(roots[0].get("input"))
            message = f"{prefix.rstrip('.')} must be a string or an object with an utterance; got {got}"
            return InvalidInput(message, code="invalid_item", field=prefix.rstrip("."))
        inside = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in self.errors]  # without the union's tag
        error = from_errors(inside, REQUEST_FIELDS, prefix)
        return error if isinstance(error, InvalidInput) else InvalidInput(error.message, field=error.field)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else type(value).__name__


def _item_or_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError as exc:
        return InvalidItem(exc.errors(include_url=False))


BatchEntry = Annotated[
    Annotated[Annotated[DialogueItem, Tag("object")] | Annotated[str, Tag("string")], Discriminator(_object_or_string)],
    WrapValidator(_item_or_error),  # an item that does not validate is reported in its slot (InvalidItem)
]


class BatchRequest(BaseModel):
    """Many items at once; a plain string is a comment without history."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        "you are all idiots",
                        {"history": ["I made soup"], "utterance": "looks disgusting"},
                        {"utterance": "have a nice day", "threshold": 0.9},
                    ],
                    "threshold": 0.5,
                }
            ]
        },
    )
    items: list[BatchEntry] = Field(description="items to classify; results come back in this order")
    threshold: Threshold = None
    item_errors: Literal["report", "fail"] = Field(
        "report",
        description="report: an item that breaks a limit gets {'error': ...} in its own slot and the others are "
        "classified; fail: the whole request is refused (422) on the first such item",
    )


#: the field names of the request models (an unknown field is answered with the closest of them)
REQUEST_FIELDS = frozenset(ClassifyRequest.model_fields) | frozenset(BatchRequest.model_fields)
REQUEST_FIELDS |= frozenset(TurnIn.model_fields)


class Truncation(BaseModel):
    """What the model did not read of an item."""

    utterance_chars_unread: int = Field(
        ge=0,
        description="characters at the end of the utterance past the last window read (0 unless a window cap cut "
        "it; the API refuses such items with too_many_windows, so 0 here)",
    )
    history_turns_dropped: int = Field(
        ge=0,
        description="history turns (oldest first) not read at all: the model's token budget for the history "
        "(~30 tokens beside a long utterance, the rest of 128 beside a short one) or its max_history_turns left "
        "no room for them",
    )


class Classification(BaseModel):
    label: Literal["OFFENSIVE", "SAFE"] = Field(description="OFFENSIVE when score >= threshold")
    score: float = Field(ge=0.0, le=1.0, description="calibrated probability that the utterance is offensive")
    threshold: float = Field(description="the threshold the label was decided at")
    categories: dict[str, float] = Field(description="calibrated probability per model head (label family)")
    windows: int = Field(
        ge=1,
        description="windows the utterance was read in: 1 when it fits the model's input (~125 tokens, ~500 "
        "characters of prose), more for a long message, read whole in overlapping windows (each with the same "
        "history); the score is the highest over the windows",
    )
    language: str | None = Field(
        None,
        description="the utterance's language (ISO 639-1), 'und' when it cannot be told with confidence (short "
        "texts often); absent when the service's language check is off (SAFETY_LANGUAGE_CHECK)",
    )
    language_supported: bool | None = Field(
        None,
        description="false when the utterance is confidently in a language the model does not read, or not in Latin "
        "script (it is English-only): the verdict is still given, but it is not to be trusted; null with 'und'",
    )
    truncated: Truncation | None = Field(None, description="only when part of the item was not read: what was left out")


class WordContribution(BaseModel):
    word: str = Field(description="the word, text[start:end] of the text it comes from")
    start: int = Field(description="character offset of the word in that text")
    end: int
    contribution: float | None = Field(
        description="the word's share of score - baseline (shapley) or score - score without this word "
        "(occlusion); > 0 pushes towards OFFENSIVE; null: not explained"
    )


class Explanation(BaseModel):
    method: Literal["shapley", "occlusion"] = Field(
        description="shapley: Shapley values over words (KernelSHAP); occlusion: leave one word out"
    )
    score: float = Field(description="the score being explained (the response's score)")
    baseline: float | None = Field(
        None, description="shapley: the score without any explained word; the contributions add up to score - baseline"
    )
    exact: bool | None = Field(None, description="shapley: every coalition was scored (up to 6 words)")
    coalitions: int | None = Field(None, description="shapley: coalitions scored")
    utterance: list[WordContribution]
    history: list[list[WordContribution]] | None = Field(None, description="per turn, when explain_history")
    unexplained_words: int = Field(description="words past the per-request cap, with contribution null")


class ClassifyResponse(Classification):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "label": "OFFENSIVE",
                    "score": 0.93,
                    "threshold": 0.5,
                    "model": "dialogue-safety@1.0.0",
                    "categories": {"offensive": 0.93},
                    "windows": 1,
                    "language": "en",
                    "language_supported": True,
                },
                {
                    "label": "OFFENSIVE",
                    "score": 0.91,
                    "threshold": 0.5,
                    "model": "dialogue-safety@1.0.0",
                    "categories": {"offensive": 0.91},
                    "windows": 8,
                    "language": "en",
                    "language_supported": True,
                    "truncated": {"utterance_chars_unread": 0, "history_turns_dropped": 5},
                },
            ]
        }
    )
    model: str = Field(description="<name>@<version> of the model that answered")
    explanation: Explanation | None = Field(None, description="only when the request set explain")


class ItemError(BaseModel):
    """The slot of a batch item that could not be classified (no label, no score)."""

    error: ErrorInfo


class BatchResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "results": [
                        {
                            "label": "OFFENSIVE",
                            "score": 0.97,
                            "threshold": 0.5,
                            "categories": {"offensive": 0.97},
                            "windows": 1,
                            "language": "en",
                            "language_supported": True,
                        },
                        {
                            "label": "SAFE",
                            "score": 0.06,
                            "threshold": 0.5,
                            "categories": {"offensive": 0.06},
                            "windows": 1,
                            "language": "fr",
                            "language_supported": False,
                        },
                        {
                            "error": {
                                "code": "empty_utterance",
                                "message": "the utterance is empty; send the text to classify",
                                "field": "items[2].utterance",
                            }
                        },
                    ],
                    "errors": 1,
                    "model": "dialogue-safety@1.0.0",
                }
            ]
        }
    )
    results: list[Classification | ItemError] = Field(
        description="one result per item, in the order of the items: a classification, or {'error': ...} for an "
        "item that could not be classified"
    )
    errors: int = Field(description="how many slots of results hold an error instead of a classification")
    model: str


class Status(BaseModel):
    status: str
    model: str | None = None


def _to_example(item: DialogueItem | str, limits: Limits, prefix: str) -> Example:
    """The request item as an :class:`Example`, checked by the one set of item rules."""
    if isinstance(item, str):
        example = Example(utterance=item)
    else:
        turns = tuple(Turn(h) if isinstance(h, str) else Turn(h.text, h.speaker) for h in item.history)
        example = Example(utterance=item.utterance, history=turns)
    limits.check_example(example, prefix)
    return example


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _predict(
    state: ServiceState, request: Request, examples: list[Example]
) -> tuple[list[Prediction], ServedModel] | None:
    """Run ``examples`` through the serving model's batcher: the predictions and the model that made
    them (a hot swap may have installed another since); None if the client disconnected first (its
    items are then dropped before inference)."""
    served = state.require_served()
    batcher = served.batcher
    futures = await batcher.enqueue(examples, request.scope.get(ANNOUNCEMENT))
    waiter: asyncio.Future[Any] = futures[0] if len(futures) == 1 else asyncio.gather(*futures)
    watcher = asyncio.ensure_future(_until_disconnect(request.receive))
    try:
        await asyncio.wait((waiter, watcher), return_when=asyncio.FIRST_COMPLETED)
        answered = waiter.done()  # decided here: a cancelled gather() is not done() until a later loop turn
    finally:
        watcher.cancel()
        if not waiter.done():
            waiter.cancel()
        batcher.release(futures)
    if not answered or waiter.cancelled():
        return None
    result = waiter.result()
    return ([result] if len(futures) == 1 else list(result)), served


@dataclass(frozen=True)
class _RouteLabel:
    """What :class:`dialogue_safety.service.telemetry.RequestMetricsMiddleware` reads from ``scope["route"]``."""

    path: str


class EarlyRefusalMiddleware:
    """Answer 429 to ``POST /v1/classify`` and ``/v1/classify/batch`` before their body is read or
    parsed when the batcher would refuse even one item now (:meth:`ServiceState.early_refusal`).

    Under overload most requests are refused: a refusal must cost far less than an answer, or
    refusing alone takes the CPU that the accepted requests need (and the event loop falls behind,
    so every answer, 429s included, comes late). Served by ``dialogue-safety serve``, the server's
    protocol gives these answers itself, before any ASGI work (:mod:`dialogue_safety.service.server`); this
    middleware is the same rule for any other ASGI server. The connection stays open (the unread
    body is skipped).
    """

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        announcement: Announcement | None = scope.get(ANNOUNCEMENT)  # admitted from its head by the server
        if announcement is None:
            refusal = self.state.early_refusal(scope["method"], scope["path"])
            if refusal is not None:
                scope["route"] = _RouteLabel(scope["path"])  # counted under its route, not "unmatched"
                await error_response(refusal)(scope, receive, send)
                return
        try:
            await self.app(scope, receive, send)
        finally:
            if announcement is not None:
                announcement.settle()  # ended before its items were queued (invalid, refused...)


def _build_router(state: ServiceState) -> APIRouter:
    dependencies = api_key_declaration(state.settings)

    v1 = APIRouter(prefix="/v1", tags=["classification"], dependencies=dependencies, responses=ERROR_RESPONSES)
    ops = APIRouter(tags=["operations"])
    log_texts = state.settings.log_texts

    @v1.post("/classify", response_model=ClassifyResponse, summary="Classify the last utterance of a dialogue")
    async def classify(body: ClassifyRequest, request: Request) -> Response:
        example = _to_example(body, state.limits, "")
        occlusions = None
        if body.explain:
            occlusions = explain.plan_within(
                example, state.settings.queue_size, history=body.explain_history, method=body.explain_method
            )
        answer = await _predict(state, request, occlusions.examples() if occlusions else [example])
        if answer is None:
            return Response(status_code=CLIENT_CLOSED)
        predictions, served = answer
        state.limits.check_read(predictions[0].read)  # more windows than SAFETY_MAX_WINDOWS: 422
        result = state.decide(predictions[0], body.threshold, served=served)
        result["model"] = served.model_id
        if occlusions is not None:
            result["explanation"] = occlusions.explanation([p.score for p in predictions])
        state.metrics.count_labels([result["label"]])
        state.metrics.count_reads([predictions[0].read])
        if log_texts:
            log.info(
                "classify history=%r utterance=%r -> %s %.4f",
                [t.text for t in example.history],
                example.utterance,
                result["label"],
                result["score"],
            )
        return JSONResponse(result)

    @v1.post("/classify/batch", response_model=BatchResponse, summary="Classify many items in one request")
    async def classify_batch(body: BatchRequest, request: Request) -> Response:
        state.limits.check_batch(len(body.items))
        examples: dict[int, Example] = {}
        results: list[dict[str, Any]] = [{} for _ in body.items]
        for i, item in enumerate(body.items):
            try:
                if isinstance(item, InvalidItem):
                    raise item.error(f"items[{i}].")
                examples[i] = _to_example(item, state.limits, f"items[{i}].")
            except InvalidInput as exc:
                if body.item_errors == "fail":
                    raise
                results[i] = error_body(exc.code, exc.message, exc.field)
        # no item to classify: still only a ready service answers 200
        answer = await _predict(state, request, list(examples.values())) if examples else ([], state.require_served())
        if answer is None:
            return Response(status_code=CLIENT_CLOSED)
        predictions, served = answer
        read = {}
        for i, prediction in zip(list(examples), predictions, strict=True):
            try:
                state.limits.check_read(prediction.read, f"items[{i}].")  # more windows than SAFETY_MAX_WINDOWS
            except InvalidInput as exc:
                if body.item_errors == "fail":
                    raise
                results[i] = error_body(exc.code, exc.message, exc.field)
                del examples[i]
                continue
            item = body.items[i]
            own = None if isinstance(item, str) else item.threshold
            results[i] = state.decide(prediction, body.threshold, own, served=served)
            read[i] = prediction.read
        classified = [results[i] for i in examples]
        state.metrics.count_labels([r["label"] for r in classified])
        state.metrics.count_reads(read.values())
        if log_texts:
            for example, r in zip(examples.values(), classified, strict=True):
                log.info(
                    "classify history=%r utterance=%r -> %s %.4f",
                    [t.text for t in example.history],
                    example.utterance,
                    r["label"],
                    r["score"],
                )
        errors = len(results) - len(examples)
        return JSONResponse({"results": results, "errors": errors, "model": served.model_id})

    @v1.get("/model", summary="The model card of the model being served")
    async def model_card() -> dict[str, Any]:
        served = state.require_served()
        classifier = state.classifier
        assert classifier is not None
        card = public_card(classifier.card)  # a few KB; the full card stays in the model directory
        batcher = served.batcher
        card["serving"] = {
            "model": state.model_id,
            "package_version": _package_version(),
            "variant": classifier.variant,
            "provider": classifier.provider,
            "threshold": state.default_threshold,
            "max_batch_size": state.settings.max_batch_size,
            "max_batch_tokens": state.settings.max_batch_tokens,
            "max_queue_wait_ms": _ms_or_none(batcher.max_queue_wait_s),
            # where the bound comes from: the setting, or (unset) full batches as measured at warm-up
            "max_queue_wait_source": "setting" if state.settings.max_queue_wait_ms is not None else "measured",
            "full_batch_ms": _ms_or_none(served.full_batch_s),
            # a full batch at the speed batches run now (a derived bound keeps at least three of them)
            "full_batch_now_ms": _ms_or_none(batcher.estimator.full_batch_s),
            "latency_bound_ms": _ms_or_none(batcher.estimator.latency_bound_s),
            # int8 answers alone unless a check band is set: then dialogues it scores this near a threshold
            # are scored again with fp32 (checked_items since this model was loaded)
            "int8_check": {
                "band": getattr(classifier, "check_band", 0.0),
                "thresholds": list(getattr(classifier, "check_thresholds", ())),
                "checked_items": getattr(classifier, "checked_items", 0),
            },
        }
        return card

    @ops.get(
        HEALTH_PATH,
        response_model=Status,
        summary="Liveness: the process serves HTTP",
        responses={503: {"model": ErrorResponse, "description": "the model failed to load"}},
    )
    async def health() -> Response:
        if state.load_error is not None:
            state.require_ready()  # raises model_failed
        return JSONResponse({"status": "ok", "model": state.model_id or None})

    @ops.get(
        "/ready",
        response_model=Status,
        summary="Readiness: the model is loaded and warmed up",
        responses={503: {"model": ErrorResponse, "description": "not ready yet"}},
    )
    async def ready() -> Response:
        state.require_ready()
        return JSONResponse({"status": "ready", "model": state.model_id})

    @ops.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics() -> Response:
        # the promise as it stands now: a bound that follows the machine also moves between batches (it decays)
        bound = state.served.batcher.estimator.latency_bound_s if state.served is not None else None
        if bound is not None:
            state.metrics.observe_latency_bound(bound)
        return Response(state.metrics.render(), media_type=state.metrics.content_type)

    router = APIRouter()
    router.include_router(v1)
    router.include_router(ops)
    return router


def create_app(
    settings: ServiceSettings | None = None,
    *,
    classifier_factory: ClassifierFactory | None = None,
    on_fatal: Callable[[], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """Build the app; ``settings`` default to the ``SAFETY_*`` environment. ``on_fatal`` is called
    (on the event loop) when the model cannot be loaded: the CLI stops the server then; ``on_ready``
    once the first model serves: the CLI settles the heap then (:func:`dialogue_safety.service.memory.settle_heap`)."""
    settings = settings if settings is not None else ServiceSettings()
    state = ServiceState(settings, classifier_factory or load_onnx_classifier, on_fatal, on_ready)
    swapper = ModelSwapper(state)
    game = breakit_api.BreakItGame(state, settings.breakit_db) if settings.breakit_db else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log_auth_state(settings)
        if game is not None:
            await game.open()  # a database that cannot be opened stops the start-up, loudly
        loader = asyncio.create_task(state.load(), name="safety-model-loader")
        swapper.install_sighup()
        try:
            yield
        finally:
            swapper.remove_sighup()
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)
            await state.stop()
            if game is not None:
                game.close()

    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from the app itself
    # (/static-offline-docs), never from a CDN, so they render on air-gapped deployments.
    app = FastAPIOffline(
        title="Dialogue safety classifier",
        summary="Is the last message of this conversation offensive, given what was said before it?",
        description=(
            "`info.version` is the version of the dialogue-safety package (this API); the model has its own "
            "version, named in every answer's `model` field (`<name>@<version>`), in `info.x-model` here and in "
            "`GET /v1/model`."
        ),
        version=_package_version(),
        lifespan=lifespan,
        strict_content_type=False,  # a body without Content-Type is read as JSON; a wrong one is a 415
    )
    app.state.safety = state
    app.state.swapper = swapper  # the hot swap's route reaches it here (hot_swap.swapper_of)
    app.state.early_admission = state.admit_from_head  # dialogue_safety.service.server's protocol answers these itself
    install_error_handlers(app, REQUEST_FIELDS)
    # Innermost first: the body guard (size, time, in-flight bytes), then the early 429 of an
    # overloaded service (before any body byte is read), then the API key (checked before that),
    # then the request metrics (outermost: they see every answer).
    app.add_middleware(
        BodyGuardMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_inflight_body_bytes=settings.max_inflight_body_bytes,
    )
    app.add_middleware(EarlyRefusalMiddleware, state=state)
    # always installed: without a key it still turns the admin endpoints away
    app.add_middleware(ApiKeyMiddleware, api_key=api_key_of(settings), public_docs=settings.public_docs)
    app.add_middleware(RequestMetricsMiddleware, metrics=state.metrics)
    app.include_router(_build_router(state))
    app.include_router(admin_router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES)
    if game is not None:  # the break-it game: its routes reach it through app.state (breakit.api.game_of)
        app.state.breakit = game
        app.include_router(breakit_api.router, responses=ERROR_RESPONSES)
        app.include_router(
            breakit_api.admin_router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES
        )
        app.include_router(breakit_api.page_router)
    generate_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = apply_to_openapi(generate_openapi(), state.limits)
        # the model may be swapped while the API stays: its id is added per call, not cached
        info = {**app.openapi_schema["info"], "x-package-version": _package_version()}
        info["x-model"] = state.model_id or None
        return {**app.openapi_schema, "info": info}

    app.openapi = openapi  # type: ignore[method-assign]
    return app


@functools.cache  # read from the installed metadata once, not on every /openapi.json or /v1/model
def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dialogue-safety")
    except PackageNotFoundError:
        return "0.0.0"


def _ms_or_none(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
