"""The classification API's routes: module-level routers, as the break-it game's (:mod:`dialogue_safety.breakit.api`).

Every route reaches the app's :class:`~dialogue_safety.service.state.ServiceState` through the dependency
:func:`state_of` (``app.state.safety``, set by :func:`dialogue_safety.service.app.create_app`), which also
puts :data:`v1` behind the API key's declaration when it includes it. Texts are never logged unless
``log_texts`` is set.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import Limits
from dialogue_safety.core.messages import JudgedMessages, every_turn, every_turn_of_turns
from dialogue_safety.core.model_card import public_card
from dialogue_safety.core.schema import Example, Prediction, Turn
from dialogue_safety.service import chat
from dialogue_safety.service.admission import CLASSIFY, EXPLAIN, LaneName, http_client
from dialogue_safety.service.errors import ERROR_RESPONSES, ErrorResponse, error_body
from dialogue_safety.service.schemas import (
    BatchRequest,
    BatchResponse,
    ClassifyRequest,
    ClassifyResponse,
    ConversationRequest,
    ConversationResponse,
    DialogueItem,
    InvalidItem,
    Status,
)
from dialogue_safety.service.state import ServedModel, ServiceState

log = logging.getLogger("dialogue_safety.service.routes")
HEALTH_PATH = "/health"  # liveness: answered without the model (the HTTP benchmarks' floor)
CLIENT_CLOSED = 499  # nginx's "client closed request": the caller left, nobody reads the answer


def state_of(request: Request) -> ServiceState:
    """The app's service state (``app.state.safety``)."""
    state: ServiceState = request.app.state.safety
    return state


State = Annotated[ServiceState, Depends(state_of)]


def _to_example(item: DialogueItem | str, limits: Limits, prefix: str) -> tuple[Example, dict[str, Any] | None]:
    """The request item as an :class:`Example`, checked by the one set of item rules, and which of
    its chat messages is judged (None without messages)."""
    judged = None
    if isinstance(item, str):
        example = Example(utterance=item)
    elif (messages := chat.judged_messages(item, item.utterance, item.history, prefix, limits)) is not None:
        example, judged = messages.example, messages.judged()
    else:
        turns = tuple(Turn(h) if isinstance(h, str) else Turn(h.text, h.speaker) for h in item.history)
        example = Example(utterance=item.utterance or "", history=turns)
    limits.check_example(example, prefix)
    return example, judged


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark the outcome of a future nobody awaits any more as seen (asyncio logs an unseen exception)."""
    if not future.cancelled():
        future.exception()


async def predict(
    state: ServiceState,
    request: Request,
    examples: list[Example],
    lane: LaneName = CLASSIFY,
    served: ServedModel | None = None,
) -> tuple[list[Prediction | InvalidInput], ServedModel] | None:
    """Run ``examples`` through the serving model's batcher (``served``: the one already chosen), charged
    to the caller in ``lane``: per item its prediction, or the :class:`InvalidInput` it was refused with
    (``too_many_windows``; its ``field`` names the item's own utterance, the caller adds where the item sits
    in its request), and the model that made them (a hot swap may have installed another since); None if
    the client disconnected first (its items are then dropped before inference, and their charge given
    back)."""
    served = served or state.require_served()
    batcher = served.batcher
    futures = await batcher.enqueue(examples, client=http_client(request.scope), lane=lane)
    # a lone item is awaited as it is (the lone request's path adds no gather)
    waiter: asyncio.Future[Any] = futures[0] if len(futures) == 1 else asyncio.gather(*futures, return_exceptions=True)
    watcher = asyncio.ensure_future(_until_disconnect(request.receive))
    try:
        await asyncio.wait((waiter, watcher), return_when=asyncio.FIRST_COMPLETED)
        answered = waiter.done()  # decided here: a cancelled gather() is not done() until a later loop turn
    finally:
        watcher.cancel()
        if not waiter.done():
            waiter.cancel()
            waiter.add_done_callback(_retrieved)  # a cancelled gather() ends with CancelledError as its exception
        batcher.release(futures)
    if not answered or waiter.cancelled():
        return None
    outcomes: list[Prediction | InvalidInput] = []
    results = [waiter.exception() or waiter.result()] if len(futures) == 1 else waiter.result()
    for outcome in results:
        if isinstance(outcome, BaseException) and not isinstance(outcome, InvalidInput):
            raise outcome  # the batch failed (503) or the service stopped: the request fails as before
        outcomes.append(outcome)
    return outcomes, served


def predictions_of(outcomes: list[Prediction | InvalidInput]) -> list[Prediction]:
    """The predictions of a request whose items stand or fall together: the first refusal is raised."""
    for outcome in outcomes:
        if isinstance(outcome, InvalidInput):
            raise outcome
    return [o for o in outcomes if not isinstance(o, InvalidInput)]


#: ``/v1/*``: the app adds the API key's declaration when it includes it (the key is a setting)
v1 = APIRouter(prefix="/v1", tags=["classification"], responses=ERROR_RESPONSES)
#: health, readiness and metrics: never behind the key
ops = APIRouter(tags=["operations"])


@v1.post("/classify", response_model=ClassifyResponse, summary="Classify the last utterance of a dialogue")
async def classify(body: ClassifyRequest, request: Request, state: State) -> Response:
    example, judged = _to_example(body, state.limits, "")
    if body.explain:
        served = state.require_served()
        occlusions = await state.plan_explanation(
            served, example, history=body.explain_history, method=body.explain_method
        )
        answer = await predict(state, request, occlusions.examples(), EXPLAIN, served)
    else:
        occlusions = None
        answer = await predict(state, request, [example])
    if answer is None:
        return Response(status_code=CLIENT_CLOSED)
    outcomes, served = answer
    predictions = predictions_of(outcomes)
    [result] = await state.decide_all([(predictions[0], example, None)], body.threshold, served=served)
    result["model"] = served.model_id
    if judged is not None:
        result["judged"] = judged
    if occlusions is not None:
        result["explanation"] = occlusions.explanation([p.score for p in predictions])
    state.metrics.count_labels([result["label"]])
    state.metrics.count_reads([predictions[0].read])
    if state.settings.log_texts:
        log.info(
            "classify history=%r utterance=%r -> %s %.4f",
            [t.text for t in example.history],
            example.utterance,
            result["label"],
            result["score"],
        )
    return JSONResponse(result)


@v1.post("/classify/batch", response_model=BatchResponse, summary="Classify many items in one request")
async def classify_batch(body: BatchRequest, request: Request, state: State) -> Response:
    state.limits.check_batch(len(body.items))
    examples: dict[int, Example] = {}
    judged: dict[int, dict[str, Any] | None] = {}
    results: list[dict[str, Any]] = [{} for _ in body.items]
    for i, item in enumerate(body.items):
        try:
            if isinstance(item, InvalidItem):
                raise item.error(f"items[{i}].")
            examples[i], judged[i] = _to_example(item, state.limits, f"items[{i}].")
        except InvalidInput as exc:
            if body.item_errors == "fail":
                raise
            results[i] = error_body(exc.code, exc.message, exc.field)
    # no item to classify: still only a ready service answers 200
    answer = await predict(state, request, list(examples.values())) if examples else ([], state.require_served())
    if answer is None:
        return Response(status_code=CLIENT_CLOSED)
    outcomes, served = answer
    read = {}
    decided: dict[int, tuple[Prediction, Example, float | None]] = {}
    for i, prediction in zip(list(examples), outcomes, strict=True):
        if isinstance(prediction, InvalidInput):  # more windows than SAFETY_MAX_WINDOWS: refused unread
            prediction.field = f"items[{i}].{prediction.field}"
            if body.item_errors == "fail":
                raise prediction
            results[i] = error_body(prediction.code, prediction.message, prediction.field)
            del examples[i]
            continue
        item = body.items[i]
        decided[i] = (prediction, examples[i], None if isinstance(item, str) else item.threshold)
        read[i] = prediction.read
    answers = await state.decide_all(list(decided.values()), body.threshold, served=served)
    for i, decision in zip(decided, answers, strict=True):
        results[i] = decision
        if judged[i] is not None:
            results[i]["judged"] = judged[i]
    classified = [results[i] for i in examples]
    state.metrics.count_labels([r["label"] for r in classified])
    state.metrics.count_reads(read.values())
    if state.settings.log_texts:
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


def _conversation_turns(body: ConversationRequest, limits: Limits) -> tuple[list[JudgedMessages], str, str]:
    """The turns of a conversation request to judge, each checked by the item rules, and how the request
    names its list and a turn's text (for errors)."""
    if (body.messages is None) == (body.turns is None):
        raise InvalidInput("send the conversation as messages or as turns (one of them)", field="messages")
    where, text = ("messages", ".content") if body.messages is not None else ("turns", "")
    sent = body.messages if body.messages is not None else body.turns
    assert sent is not None
    if len(sent) > limits.max_request_history_turns + 1:
        raise InvalidInput(
            f"{where} has {len(sent)} turns; send at most {limits.max_request_history_turns + 1} "
            "(or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
            code="too_many_history_turns",
            field=where,
        )
    if body.messages is not None:
        judged = every_turn([m.as_sent() for m in body.messages], roles=body.roles, include_system=body.include_system)
    else:
        turns = [Turn(h) if isinstance(h, str) else Turn(h.text, h.speaker) for h in body.turns or []]
        judged = every_turn_of_turns(turns, body.roles)
        if not judged:
            raise InvalidInput(f"turns holds no turn of the speakers {body.roles} to judge", field="roles")
    if len(judged) > limits.max_batch_items:
        raise InvalidInput(
            f"{len(judged)} turns to judge in one request; judge at most {limits.max_batch_items} "
            "(SAFETY_MAX_BATCH_ITEMS): send fewer roles, or the conversation in parts",
            code="too_many_items",
            field=where,
        )
    for one in judged:
        try:
            limits.check_example(one.example)
        except InvalidInput as exc:
            exc.field = one.message_field(exc.field, where=where, text=text)
            raise
    return judged, where, text


@v1.post(
    "/classify/conversation",
    response_model=ConversationResponse,
    summary="Classify every turn of a conversation, each given the turns before it",
)
async def classify_conversation(body: ConversationRequest, request: Request, state: State) -> Response:
    judged, where, text = _conversation_turns(body, state.limits)
    examples = [one.example for one in judged]
    answer = await predict(state, request, examples)  # one request: admitted as the sum of its rows
    if answer is None:
        return Response(status_code=CLIENT_CLOSED)
    outcomes, served = answer
    predictions: list[Prediction] = []
    for one, outcome in zip(judged, outcomes, strict=True):
        if isinstance(outcome, InvalidInput):  # more windows than SAFETY_MAX_WINDOWS: refused unread
            outcome.field = one.message_field(outcome.field, where=where, text=text)
            raise outcome
        predictions.append(outcome)
    decided = await state.decide_all(
        [(p, one.example, None) for p, one in zip(predictions, judged, strict=True)], body.threshold, served=served
    )
    results = [{**result, "index": one.index, "role": one.role} for result, one in zip(decided, judged, strict=True)]
    state.metrics.count_labels([r["label"] for r in results])
    state.metrics.count_reads(o.read for o in outcomes if not isinstance(o, InvalidInput))
    if state.settings.log_texts:
        for one, r in zip(judged, results, strict=True):
            log.info(
                "classify conversation turn %d %r -> %s %.4f", one.index, one.example.utterance, r["label"], r["score"]
            )
    return JSONResponse({"results": results, "model": served.model_id})


@v1.get("/model", summary="The model card of the model being served")
async def model_card(state: State) -> dict[str, Any]:
    served = state.require_served()
    classifier = state.classifier
    assert classifier is not None
    card = public_card(classifier.card)  # a few KB; the full card stays in the model directory
    card["serving"] = {
        "model": served.model_id,
        "package_version": package_version(),
        "variant": classifier.variant,
        "provider": classifier.provider,
        "threshold": state.default_threshold,
        "max_batch_size": state.settings.max_batch_size,
        "max_batch_tokens": state.settings.max_batch_tokens,
        # admission: the budgets of both lanes, what one request may cost, and what is charged now
        "admission": state.gate.describe(),
        # int8 answers alone unless a check band is set: then dialogues it scores this near a threshold
        # are scored again with fp32 (checked_items since this model was loaded)
        "int8_check": {
            "band": classifier.check_band,
            "thresholds": list(classifier.check_thresholds),
            "checked_items": classifier.checked_items,
        },
        "policy": None if state.policy is None else state.policy.describe(),  # operator rules in force
    }
    return card


@ops.get(
    HEALTH_PATH,
    response_model=Status,
    summary="Liveness: the process serves HTTP",
    responses={503: {"model": ErrorResponse, "description": "the model failed to load"}},
)
async def health(state: State) -> Response:
    if state.load_error is not None:
        state.require_ready()  # raises model_failed
    return JSONResponse({"status": "ok", "model": state.model_id or None})


@ops.get(
    "/ready",
    response_model=Status,
    summary="Readiness: the model is loaded and warmed up",
    responses={503: {"model": ErrorResponse, "description": "not ready yet"}},
)
async def ready(state: State) -> Response:
    state.require_ready()
    return JSONResponse({"status": "ready", "model": state.model_id})


@ops.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(state: State) -> Response:
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


@functools.cache  # read from the installed metadata once, not on every /openapi.json or /v1/model
def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dialogue-safety")
    except PackageNotFoundError:
        return "0.0.0"
