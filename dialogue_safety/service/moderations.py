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
  endpoint only (the service's one error table answers them so on this path:
  :data:`dialogue_safety.service.errors.OPENAI_ERROR_PATHS`; ``code`` is ours, ``param`` the field at
  fault); a request the table answers with 422 gets 400 here, as OpenAI answers an invalid request.

The router is module-level, as :mod:`dialogue_safety.service.routes`'s; its route reaches the service
through the one dependency (:data:`dialogue_safety.service.state.State`) and the model through its one
door (:meth:`dialogue_safety.service.state.ServiceState.score`).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.limits import Limits
from dialogue_safety.core.messages import history_field, history_of, message_text, read_messages
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import CATEGORIES_TABLE, Policy
from dialogue_safety.core.schema import Example, Turn
from dialogue_safety.service.admission import http_client
from dialogue_safety.service.errors import CLIENT_CLOSED, MODERATIONS_PATH, OPENAI_ERROR_RESPONSES
from dialogue_safety.service.schemas import ModerationRequest, ModerationResponse, TextInput
from dialogue_safety.service.state import State

ID_PREFIX = "modr-"
#: our head (label family) → OpenAI's moderation category that means the same; other heads keep their names
OPENAI_NAMES: dict[str, str] = {"offensive": "harassment", "hateful": "hate", "violence": "violence"}
#: the category an operator's block rule adds (true) to the result of an input it matched
POLICY_CATEGORY = "policy"


def openai_name(head: str) -> str:
    return OPENAI_NAMES.get(head, head)


def _inputs(body: ModerationRequest) -> list[str]:
    if isinstance(body.input, str):
        return [body.input]
    if body.input and isinstance(body.input[0], TextInput):
        parts = [p.model_dump(exclude_none=True) for p in body.input if isinstance(p, TextInput)]
        return [message_text(parts, "input")]
    return [t for t in body.input if isinstance(t, str)]


def _history(body: ModerationRequest, limits: Limits) -> tuple[tuple[Turn, ...], tuple[int, ...]]:
    if not body.conversation:
        return (), ()
    if len(body.conversation) > limits.max_request_history_turns:
        raise InvalidInput(
            f"conversation has {len(body.conversation)} messages; send at most the {limits.max_request_history_turns} "
            "most recent (or raise SAFETY_MAX_REQUEST_HISTORY_TURNS)",
            code="too_many_history_turns",
            field="conversation",
        )
    raw = [m.as_sent() for m in body.conversation]
    return history_of(read_messages(raw, "conversation"), body.include_system)  # as /v1/classify reads them


def _openai_field(field: str | None, where: str, history_index: tuple[int, ...]) -> str | None:
    """A field of the item rules (``utterance``, ``history[2]``) as this request names it (``input[1]``,
    ``conversation[4].content``: the message sent, system and tool messages counted)."""
    if field is None:
        return None
    if field.startswith("utterance"):
        return field.replace("utterance", where, 1)
    return history_field(field, history_index, "conversation") or field.replace("history", "conversation", 1)


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


router = APIRouter(tags=["openai-compatible"])


@router.post(
    MODERATIONS_PATH,
    response_model=ModerationResponse,
    summary="OpenAI-compatible moderation (errors in OpenAI's shape)",
    responses=OPENAI_ERROR_RESPONSES,
)
async def moderations(body: ModerationRequest, request: Request, state: State) -> Response:
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
    history, history_index = _history(body, state.limits)
    examples = [Example(utterance=t, history=history) for t in texts]
    single = isinstance(body.input, str) or len(texts) == 1 and not isinstance(body.input[0], str)
    for i, example in enumerate(examples):
        where = "input" if single else f"input[{i}]"
        try:
            state.limits.check_example(example)
        except InvalidInput as exc:  # the item rules name our fields; here they are OpenAI's (and ours)
            exc.field = _openai_field(exc.field, where, history_index)
            raise
    scored = await state.score(examples, client=http_client(request.scope), hangup=request.receive)
    if scored is None:
        return Response(status_code=CLIENT_CLOSED)
    predictions = []
    for i, outcome in enumerate(scored.outcomes):
        if isinstance(outcome, InvalidInput):  # more windows than SAFETY_MAX_WINDOWS: refused unread
            outcome.field = _openai_field(outcome.field, "input" if single else f"input[{i}]", history_index)
            raise outcome
        predictions.append(outcome)
    served = scored.served
    policy = state.policy  # one policy for the decisions and the categories, whatever a reload does meanwhile
    decided = await state.decide_all(
        [(p, e, None) for p, e in zip(predictions, examples, strict=True)], served=served, policy=policy
    )
    card = served.card or ModelCard()
    results = [moderation_result(answer, card, policy) for answer in decided]
    state.metrics.count_labels(["OFFENSIVE" if r["flagged"] else "SAFE" for r in results])
    state.metrics.count_reads(p.read for p in predictions)
    return JSONResponse({"id": ID_PREFIX + uuid.uuid4().hex, "model": served.model_id, "results": results})
