"""The classification API's routes: module-level routers, as the break-it game's (:mod:`dialogue_safety.breakit.api`).

Every route reaches the app's :class:`~dialogue_safety.service.state.ServiceState` through the one dependency
(:data:`dialogue_safety.service.state.State`), and the model through its one door
(:meth:`~dialogue_safety.service.state.ServiceState.score`); the app puts :data:`v1` behind the API key's
declaration when it includes it. Texts are never logged unless ``log_texts`` is set.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import Limits
from dialogue_safety.core.messages import JudgedMessages, every_turn, every_turn_of_turns, parse_messages
from dialogue_safety.core.model_card import public_card
from dialogue_safety.core.schema import Example, Prediction, Turn
from dialogue_safety.service.admission import http_client
from dialogue_safety.service.errors import CLIENT_CLOSED, ERROR_RESPONSES, ErrorResponse, error_body
from dialogue_safety.service.schemas import (
    BatchRequest,
    BatchResponse,
    ChatFields,
    ClassifyRequest,
    ClassifyResponse,
    ConversationRequest,
    ConversationResponse,
    DialogueItem,
    InvalidItem,
    Status,
)
from dialogue_safety.service.state import State, predictions_of

log = logging.getLogger("dialogue_safety.service.routes")
HEALTH_PATH = "/health"  # liveness: answered without the model (the HTTP benchmarks' floor)


def _to_example(item: DialogueItem | str, limits: Limits, prefix: str) -> tuple[Example, dict[str, Any] | None]:
    """The request item as an :class:`Example`, checked by the one set of item rules, and which of
    its chat messages is judged (None without messages)."""
    judged = None
    if isinstance(item, str):
        example = Example(utterance=item)
    elif (messages := judged_messages(item, item.utterance, item.history, prefix, limits)) is not None:
        example, judged = messages.example, messages.judged()
    else:
        turns = tuple(Turn(h) if isinstance(h, str) else Turn(h.text, h.speaker) for h in item.history)
        example = Example(utterance=item.utterance or "", history=turns)
    limits.check_example(example, prefix)
    return example, judged


def judged_messages(
    item: ChatFields, utterance: str | None, history: list[Any], prefix: str, limits: Limits
) -> JudgedMessages | None:
    """The example ``item``'s messages ask about, checked by the item rules (None: the item has no
    messages); raises :class:`InvalidInput` for messages sent with history or utterance, or that
    cannot be read, naming the message at fault (``messages[3].content``). A request may hold at most
    ``max_request_history_turns + 1`` messages, system messages included."""
    if item.messages is None:
        if utterance is None:
            raise InvalidInput(f"{prefix}utterance is required", field=f"{prefix}utterance")
        return None
    field = f"{prefix}messages"
    if utterance is not None or history:
        raise InvalidInput(f"{field} replaces history and utterance: send one or the other", field=field)
    if len(item.messages) > limits.max_request_history_turns + 1:
        raise InvalidInput(
            f"{field} has {len(item.messages)} messages; send at most the {limits.max_request_history_turns + 1} most "
            "recent (or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
            code="too_many_history_turns",
            field=field,
        )
    raw = [m.as_sent() for m in item.messages]
    judged = parse_messages(raw, include_system=item.include_system, field=field)
    try:
        limits.check_example(judged.example, prefix)
    except InvalidInput as exc:
        exc.field = judged.message_field(exc.field, prefix)
        raise
    return judged


#: ``/v1/*``: the app adds the API key's declaration when it includes it (the key is a setting)
v1 = APIRouter(prefix="/v1", tags=["classification"], responses=ERROR_RESPONSES)
#: health, readiness and metrics: never behind the key
ops = APIRouter(tags=["operations"])


@v1.post("/classify", response_model=ClassifyResponse, summary="Classify the last utterance of a dialogue")
async def classify(body: ClassifyRequest, request: Request, state: State) -> Response:
    example, judged = _to_example(body, state.limits, "")
    scored = await state.score(
        [example],
        client=http_client(request.scope),
        explain=body.explain_method if body.explain else None,
        explain_history=body.explain_history,
        hangup=request.receive,
    )
    if scored is None:
        return Response(status_code=CLIENT_CLOSED)
    predictions = predictions_of(scored.outcomes)
    [result] = await state.decide_all([(predictions[0], example, None)], body.threshold, served=scored.served)
    result["model"] = scored.served.model_id
    if judged is not None:
        result["judged"] = judged
    if scored.explanation is not None:
        result["explanation"] = scored.explanation
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
    scored = await state.score(list(examples.values()), client=http_client(request.scope), hangup=request.receive)
    if scored is None:
        return Response(status_code=CLIENT_CLOSED)
    outcomes, served = scored.outcomes, scored.served
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
        if not turns:
            raise InvalidInput("turns is empty; send at least the turn to judge", field="turns")
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
    # one request: admitted as the sum of its rows
    scored = await state.score(examples, client=http_client(request.scope), hangup=request.receive)
    if scored is None:
        return Response(status_code=CLIENT_CLOSED)
    outcomes, served = scored.outcomes, scored.served
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
