"""``POST /v1/moderations``: OpenAI's moderation API, answered by our model.

A pipeline written against OpenAI (``client.moderations.create(input=...)``, LiteLLM, guardrail
libraries) points its ``base_url`` here and works unchanged::

    POST /v1/moderations {"input": "you are a clown"}        (or a list of strings, or text parts)
    -> {"id": "modr-...", "model": "dialogue-safety@1.0.0",
        "results": [{"flagged": true, "categories": {"harassment": true, ...},
                     "category_scores": {"harassment": 0.97, ...},
                     "category_applied_input_types": {"harassment": ["text"], ...}}]}

The request and response follow OpenAI's shapes; what differs is documented in docs/api.md
("OpenAI-compatible moderation"):

* **Categories** are the model's heads, read from its card (never a fixed list), named as OpenAI
  names the same thing (:data:`OPENAI_NAMES`: ``offensive`` → ``harassment``, ``hateful`` → ``hate``,
  ``violence`` → ``violence``); a head with no OpenAI counterpart keeps its own name
  (``unsafe_in_context``). OpenAI categories the model does not judge are absent, not false.
* ``categories[c]`` is ``category_scores[c] >= `` the category's own threshold: the operator policy's
  for that head (``off``: no category), else the card's, tuned on the validation splits
  (:meth:`ModelCard.category_threshold`, shown in ``GET /v1/model`` as ``category_thresholds``). A head
  too weak to decide has no threshold (:mod:`dialogue_safety.export.categories` states the rule): it is
  reported in ``scores_only`` (an extension) under its own name, never as a category, so it is never
  true and never stands for an OpenAI category it does not measure.
* ``flagged`` is true exactly when a category is (OpenAI's invariant). It can differ from the ``label``
  of ``/v1/classify`` (the main score at the threshold in force): each category has its own threshold.
  An operator policy's allow rule makes every category false; a block rule adds the category
  ``policy`` (true); a result a policy rule decided or changed carries ``policy`` (the rule's name), an
  extension field.
* ``conversation`` (an extension): OpenAI chat messages said before the input, read as in
  ``/v1/classify``'s ``messages``: each input is judged as the next message of that conversation
  (what ``unsafe_in_context`` needs). Without it each input is judged alone.
* ``model`` may be sent (any name): the answer names the model that judged (``<name>@<version>``).
* **Errors** have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, on this
  endpoint only (:class:`OpenAIErrorShape` translates the service's one error table: ``code`` is
  ours, ``param`` the field at fault); a request the table answers with 422 gets 400 here, as
  OpenAI answers an invalid request.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import VISIBLE_PATTERN, Limits
from dialogue_safety.core.messages import history_of, message_text, read_messages
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import CATEGORIES_TABLE, Policy
from dialogue_safety.core.schema import Example, Prediction, Turn
from dialogue_safety.service.chat import ChatMessage
from dialogue_safety.service.errors import ERROR_TABLE

if TYPE_CHECKING:
    from dialogue_safety.service.state import ServedModel, ServiceState

MODERATIONS_PATH = "/v1/moderations"
ID_PREFIX = "modr-"
#: our head (label family) → OpenAI's moderation category that means the same; other heads keep their names
OPENAI_NAMES: dict[str, str] = {"offensive": "harassment", "hateful": "hate", "violence": "violence"}
#: the category an operator's block rule adds (true) to the result of an input it matched
POLICY_CATEGORY = "policy"
#: OpenAI's error ``type`` by HTTP status (anything else: invalid_request_error)
OPENAI_ERROR_TYPES: dict[int, str] = {429: "requests", 500: "server_error", 503: "server_error"}

Predict = Callable[[Any, Request, list[Example]], Awaitable[tuple[list[Prediction | InvalidInput], Any] | None]]


def openai_name(head: str) -> str:
    return OPENAI_NAMES.get(head, head)


class TextInput(BaseModel):
    """A text part, as OpenAI's multi-modal moderation input has them (other kinds are refused)."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(description="'text' (other part types are refused: we judge text only)")
    text: str | None = None


class ModerationRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"input": "you are a clown"},
                {"input": ["have a nice day", "you are all idiots"], "model": "dialogue-safety"},
                {
                    "input": "so what",
                    "conversation": [{"role": "user", "content": "my dog died this morning"}],
                },
            ]
        },
    )
    input: str | list[str] | list[TextInput] = Field(
        description="a text, a list of texts (one result each), or a list of text parts (one result, parts joined)"
    )
    model: str | None = Field(None, description="accepted for compatibility; the answer names the model that judged")
    conversation: list[ChatMessage] | None = Field(
        None,
        description="extension: chat messages said before the input; each input is judged as the next message",
    )
    include_system: bool = Field(False, strict=True, description="with conversation: keep system messages")


class ModerationResult(BaseModel):
    flagged: bool = Field(description="true exactly when a category is")
    categories: dict[str, bool] = Field(
        description="per category: its score is at or above its own threshold (GET /v1/model: category_thresholds, "
        "or the operator policy's)"
    )
    category_scores: dict[str, float] = Field(description="per category: the calibrated probability")
    category_applied_input_types: dict[str, list[Literal["text"]]]
    scores_only: dict[str, float] | None = Field(
        None,
        description="extension: the heads too weak to decide (no category threshold), under their own names: a "
        "score, never a category",
    )
    policy: str | None = Field(None, description="extension: the operator policy rule that decided or changed it")


class ModerationResponse(BaseModel):
    id: str = Field(description="modr-<hex>")
    model: str = Field(description="<name>@<version> of the model that judged")
    results: list[ModerationResult]


class OpenAIError(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorResponse(BaseModel):
    error: OpenAIError


def _inputs(body: ModerationRequest) -> list[str]:
    if isinstance(body.input, str):
        return [body.input]
    if body.input and isinstance(body.input[0], TextInput):
        parts = [p.model_dump(exclude_none=True) for p in body.input if isinstance(p, TextInput)]
        return [message_text(parts, "input")]
    return [t for t in body.input if isinstance(t, str)]


def _history(body: ModerationRequest, limits: Limits) -> tuple[Turn, ...]:
    if not body.conversation:
        return ()
    if len(body.conversation) > limits.max_request_history_turns:
        raise InvalidInput(
            f"conversation has {len(body.conversation)} messages; send at most the {limits.max_request_history_turns} "
            "most recent (or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
            code="too_many_history_turns",
            field="conversation",
        )
    raw = [m.as_sent() for m in body.conversation]
    history, _ = history_of(read_messages(raw, "conversation"), body.include_system)  # as /v1/classify reads them
    return history


def _openai_field(field: str | None, where: str) -> str | None:
    """A field of the item rules (``utterance``, ``history[2]``) as this request names it."""
    if field is None:
        return None
    return (
        field.replace("utterance", where, 1)
        if field.startswith("utterance")
        else field.replace("history", "conversation", 1)
    )


def category_thresholds(card: ModelCard, policy: Policy | None) -> dict[str, float | None]:
    """Per head of ``card``, the threshold at which its category is true (None: a score only, no category): the
    operator policy's for that head (``"off"``: a category never true), else the card's own for that category
    (:meth:`ModelCard.category_threshold`: tuned on validation; None for a head too weak to decide)."""
    out: dict[str, float | None] = {}
    for head in card.heads:
        if policy is not None and head in policy.categories:
            own = policy.categories[head]
            out[head] = math.inf if own is None else own
        else:
            out[head] = card.category_threshold(head)
    return out


def moderation_result(answer: dict[str, Any], card: ModelCard, policy: Policy | None) -> dict[str, Any]:
    """One result from the service's answer for one input (:meth:`ServiceState.decide`): ``flagged`` is true
    exactly when a category is. A head with a threshold is a category (named as OpenAI names it); a head
    without one is a score only, in ``scores_only`` under its own name. An operator's allow rule makes
    every category false; a block rule adds the category ``policy`` (true)."""
    scores = answer["categories"] or {}
    thresholds = category_thresholds(card, policy)
    categories: dict[str, bool] = {}
    category_scores: dict[str, float] = {}
    scores_only: dict[str, float] = {}
    for head, p in scores.items():
        own = thresholds.get(head)
        if own is None:
            scores_only[head] = p
            continue
        categories[openai_name(head)] = p >= own
        category_scores[openai_name(head)] = p
    rule = answer.get("policy")
    if policy is not None and rule is not None and not rule.startswith(f"{CATEGORIES_TABLE}."):
        if any(r.name == rule for r in policy.allow):
            categories = dict.fromkeys(categories, False)
        else:  # a block rule: the operator's own category
            categories[POLICY_CATEGORY] = True
            category_scores[POLICY_CATEGORY] = 1.0
    result: dict[str, Any] = {
        "flagged": any(categories.values()),
        "categories": categories,
        "category_scores": category_scores,
        "category_applied_input_types": {name: ["text"] for name in categories},
    }
    if scores_only:
        result["scores_only"] = scores_only
    if rule is not None:
        result["policy"] = rule
    return result


def openai_responses() -> dict[int | str, dict[str, Any]]:
    """The error responses of this endpoint: the error table's statuses (422 answered as 400), OpenAI's shape."""
    whens: dict[int, list[str]] = {}
    for row in ERROR_TABLE:
        whens.setdefault(400 if row.status == 422 else row.status, []).append(row.when)
    return {s: {"model": OpenAIErrorResponse, "description": "; ".join(w)} for s, w in sorted(whens.items())}


def build_router(state: ServiceState, predict: Predict, client_closed: int) -> APIRouter:
    """The ``/v1/moderations`` route on ``state``; ``predict``: how the API runs examples through the
    serving model's batcher (per item its prediction or why it was refused, and the model that made
    them; None: the caller left, who is then answered with the status ``client_closed``, as the API
    answers them)."""
    router = APIRouter(tags=["openai-compatible"])

    @router.post(
        MODERATIONS_PATH,
        response_model=ModerationResponse,
        summary="OpenAI-compatible moderation (errors in OpenAI's shape)",
        responses=openai_responses(),
    )
    async def moderations(body: ModerationRequest, request: Request) -> Response:
        texts = _inputs(body)
        if not texts:
            raise InvalidInput("input is empty; send a text or a list of texts", field="input")
        if len(texts) > state.limits.max_batch_items:
            raise InvalidInput(
                f"input has {len(texts)} texts; at most {state.limits.max_batch_items} are accepted "
                "(SAFETY_MAX_BATCH_ITEMS)",
                code="too_many_items",
                field="input",
            )
        history = _history(body, state.limits)
        examples = [Example(utterance=t, history=history) for t in texts]
        single = isinstance(body.input, str) or len(texts) == 1 and not isinstance(body.input[0], str)
        for i, example in enumerate(examples):
            where = "input" if single else f"input[{i}]"
            try:
                state.limits.check_example(example)
            except InvalidInput as exc:  # the item rules name our fields; here they are OpenAI's (and ours)
                exc.field = _openai_field(exc.field, where)
                raise
        answer = await predict(state, request, examples)
        if answer is None:
            return Response(status_code=client_closed)
        outcomes, served = answer
        served_model: ServedModel = served
        predictions = []
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, InvalidInput):  # more windows than SAFETY_MAX_WINDOWS: refused unread
                outcome.field = _openai_field(outcome.field, "input" if single else f"input[{i}]")
                raise outcome
            predictions.append(outcome)
        decided = await state.decide_all(
            [(p, e, None) for p, e in zip(predictions, examples, strict=True)], served=served_model
        )
        card = served_model.card or ModelCard()
        results = [moderation_result(answer, card, state.policy) for answer in decided]
        state.metrics.count_labels(["OFFENSIVE" if r["flagged"] else "SAFE" for r in results])
        state.metrics.count_reads(p.read for p in predictions)
        return JSONResponse({"id": ID_PREFIX + uuid.uuid4().hex, "model": served_model.model_id, "results": results})

    return router


def apply_to_openapi(schema: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Write the limits a moderation request must keep into the generated OpenAPI schema, in place."""
    components = schema.get("components", {}).get("schemas", {})
    chars = min(limits.max_turn_chars, limits.max_utterance_chars)
    text = {"type": "string", "minLength": 1, "maxLength": limits.max_utterance_chars, "pattern": VISIBLE_PATTERN}
    if "TextInput" in components:
        components["TextInput"] = {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["text"]},
                "text": {**text, "maxLength": chars},
            },
            "required": ["type", "text"],
            "description": TextInput.__doc__,
        }
    request = components.get("ModerationRequest", {}).get("properties", {})
    if "input" in request:
        for branch in request["input"].get("anyOf", []):
            if branch.get("type") == "string":
                branch.update(text)
            elif branch.get("items", {}).get("type") == "string":
                branch.update(minItems=1, maxItems=limits.max_batch_items)
                branch["items"].update(text)
            elif branch.get("type") == "array":
                branch.update(minItems=1)
    if "conversation" in request:
        for branch in request["conversation"].get("anyOf", []):
            if branch.get("type") == "array":
                branch["maxItems"] = limits.max_request_history_turns
    return schema


# -- errors in OpenAI's shape ----------------------------------------------------------------------
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


class OpenAIErrorShape:
    """Rewrite the error answers of ``/v1/moderations`` into OpenAI's shape, whoever produced them (the
    route, request validation, the API key check, the body guard), and 422 into 400. Other paths
    pass through untouched; successful answers stream through without being buffered."""

    def __init__(self, app: ASGIApp, path: str = MODERATIONS_PATH) -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def translate(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            status = int(start["status"])
            raw = b"".join(chunks)
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {"error": {"message": raw.decode("utf-8", "replace"), "code": None, "field": None}}
            status = 400 if status == 422 else status
            out = json.dumps(openai_error(status, body if isinstance(body, dict) else {}), ensure_ascii=False).encode()
            headers = [
                (k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-length", b"content-type")
            ]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
            await send({**start, "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": out})

        await self.app(scope, receive, translate)
