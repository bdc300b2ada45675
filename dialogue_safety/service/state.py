"""What one app owns: the settings, limits and metrics, and the model it serves (classifier and batcher).

:class:`ServiceState` loads and warms up the model, installs it with a fresh micro-batcher (a hot
swap installs the next one beside it: :mod:`dialogue_safety.service.hot_swap`), decides answers at
the threshold in force, and owns the one admission gate every batcher charges
(:mod:`dialogue_safety.service.admission`), which also refuses early what it would refuse. The API
(:mod:`dialogue_safety.service.app`), the hot swap and the break-it game it mounts (as its
:class:`dialogue_safety.breakit.api.Host`) all work through it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request
from starlette.types import Receive, Scope

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import InvalidInput, NotReady, ServiceError
from dialogue_safety.core.explain import Method, Plan
from dialogue_safety.core.explain import plan_within as explain_plan
from dialogue_safety.core.limits import CostBound, TokenizerWords
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import Policy, load_policy
from dialogue_safety.core.runtime_options import runtime_options
from dialogue_safety.core.schema import Example, Label, Prediction
from dialogue_safety.core.scoring import RowLogits, is_offensive, threshold_in_force
from dialogue_safety.service.admission import CLASSIFY, EXPLAIN, AdmissionGate, http_client
from dialogue_safety.service.batcher import MicroBatcher, RowModel
from dialogue_safety.service.errors import MODERATIONS_PATH
from dialogue_safety.service.priority import build_at_lower_priority
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.telemetry import ServiceMetrics

log = logging.getLogger("dialogue_safety.service.state")
#: the endpoints that reach the model, refused early (before their body is read) by an overloaded service
EARLY_REFUSED_PATHS = frozenset({"/v1/classify", "/v1/classify/batch", "/v1/classify/conversation", MODERATIONS_PATH})


class Classifier(Protocol):
    """What the service needs from :class:`dialogue_safety.core.runtime.OnnxClassifier`."""

    @property
    def card(self) -> ModelCard: ...
    @property
    def model_id(self) -> str: ...
    @property
    def variant(self) -> str: ...
    @property
    def provider(self) -> str: ...
    @property
    def check_band(self) -> float:
        """The int8 check: dialogues scored this near a threshold are scored again with fp32 (0: no check)."""
        ...

    @property
    def check_thresholds(self) -> tuple[float, ...]:
        """The thresholds the int8 check watches."""
        ...

    @property
    def checked_items(self) -> int:
        """Dialogues the int8 check scored again since the model was loaded."""
        ...

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]: ...
    def predict_encoded(
        self, encoded: Sequence[EncodedExample], threshold: float | None = None
    ) -> list[Prediction]: ...
    @property
    def workers(self) -> int:
        """Sessions the batcher's inference workers run side by side."""
        ...

    @property
    def parallel(self) -> int:
        """The workers with cores of their own."""
        ...

    @property
    def intra_op_threads(self) -> int:
        """Each worker's session's intra-op threads."""
        ...

    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: Any = None) -> Any: ...
    def cancel_token(self) -> Any: ...
    def predict_scored(self, encoded: Sequence[EncodedExample], scored: RowLogits) -> list[Prediction]: ...
    def warmup(self) -> object: ...


ClassifierFactory = Callable[[ServiceSettings], Classifier]


def load_onnx_classifier(settings: ServiceSettings) -> Classifier:
    from dialogue_safety.core.runtime import OnnxClassifier  # imported here: tests and --help never load onnxruntime

    # a derived variant's peak memory stays in a child process
    options = runtime_options(settings, derive_in_subprocess=True)
    # created in a thread below the event loop's priority: onnxruntime's intra-op threads inherit it
    classifier: Classifier = build_at_lower_priority(
        settings.inference_nice,
        lambda: OnnxClassifier(settings.model_dir, workers=settings.inference_workers, **options),
    )
    return classifier


def _counting_int8_checks(classifier: Classifier, metrics: ServiceMetrics) -> RowModel:
    """What the batcher runs: the classifier's rows and predictions, counting the dialogues its int8 check
    scored again with fp32 (``safety_int8_checked_items_total``); the classifier itself unless it has a check."""
    if not classifier.check_band:
        return classifier
    return _Int8CheckCounter(classifier, metrics)


class _Int8CheckCounter:
    def __init__(self, classifier: Classifier, metrics: ServiceMetrics) -> None:
        self.classifier = classifier
        self.metrics = metrics
        self.workers = classifier.workers
        self.parallel = classifier.parallel
        self.cancel_token = classifier.cancel_token
        self._counted = classifier.checked_items  # what the metric holds so far
        self._counting = threading.Lock()  # only the metric's update: the workers predict side by side

    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: Any = None) -> Any:
        return self.classifier.row_logits(rows, worker, cancel)

    def predict_scored(self, encoded: Sequence[EncodedExample], scored: RowLogits) -> list[Prediction]:
        predictions = self.classifier.predict_scored(encoded, scored)
        with self._counting:  # each check counted once, whichever worker sees it first
            total = self.classifier.checked_items
            self.metrics.int8_checked.inc(total - self._counted)
            self._counted = total
        return predictions


@dataclass(frozen=True)
class ServedModel:
    """The model a request is admitted to, installed in one step: the batcher that scores it and the
    id and card threshold of the classifier behind that batcher. A request keeps the one it was
    admitted to, so a request queued before a hot swap is scored by the old model and answered with
    the old model's id and threshold."""

    model_id: str
    card_threshold: float
    batcher: MicroBatcher
    card: ModelCard | None = None  # the classifier's card (what an operator policy reads: heads, normalisation)


@dataclass(frozen=True)
class Scored:
    """What :meth:`ServiceState.score` returns: per example its prediction or why it was refused, the model
    that made them, and the explanation asked for (None without)."""

    outcomes: list[Prediction | InvalidInput]
    served: ServedModel
    explanation: dict[str, Any] | None = None

    @property
    def model_id(self) -> str:
        return self.served.model_id


def predictions_of(outcomes: Sequence[Prediction | InvalidInput]) -> list[Prediction]:
    """The predictions of a request whose items stand or fall together: the first refusal is raised."""
    for outcome in outcomes:
        if isinstance(outcome, InvalidInput):
            raise outcome
    return [o for o in outcomes if not isinstance(o, InvalidInput)]


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark the outcome of a future nobody awaits any more as seen (asyncio logs an unseen exception)."""
    if not future.cancelled():
        future.exception()


class _InForce:
    """The policy in force when the answer is decided (:meth:`ServiceState.decide`'s default)."""


IN_FORCE = _InForce()


class ServiceState:
    """What one app owns: settings, limits, metrics, and (once loaded) classifier and batcher."""

    def __init__(
        self,
        settings: ServiceSettings,
        factory: ClassifierFactory,
        on_fatal: Callable[[str], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        # called with the load error when the model cannot load: the CLI stops the server (exit status 3)
        self.on_fatal = on_fatal
        self.on_ready = (
            on_ready  # called once the first model serves: the CLI freezes the heap (dialogue_safety.service.memory)
        )
        self.factory = factory
        self.limits = settings.limits
        self.metrics = ServiceMetrics()
        self.classifier: Classifier | None = None
        self.served: ServedModel | None = None  # None before the load: no placeholder id or threshold
        self._retiring: set[MicroBatcher] = set()  # replaced by a hot swap, draining (stopped with the service)
        self.policy_reload = asyncio.Lock()  # POST /admin/policy: one reload at a time
        self.ready = False
        self.load_error: str | None = None
        self.loading: str | None = None  # what the first load is doing now (the detail of /ready's 503)
        # the operator's rules (SAFETY_POLICY): replaced whole by POST /admin/policy, never changed in place
        self.policy: Policy | None = load_policy(settings.policy) if settings.policy is not None else None
        self.gate = AdmissionGate(
            settings.max_pending_tokens,
            settings.max_explain_tokens,
            retry_after_s=settings.retry_after_s,
            observer=self.metrics,
        )
        self.metrics.set_budgets({name: lane.budget for name, lane in self.gate.lanes.items()})

    @property
    def batcher(self) -> MicroBatcher | None:
        return None if self.served is None else self.served.batcher

    @property
    def model_id(self) -> str:
        return "" if self.served is None else self.served.model_id

    @property
    def card_threshold(self) -> float | None:
        return None if self.served is None else self.served.card_threshold

    async def load(self) -> None:
        """Load and warm up the model off the event loop, then start the batcher."""
        self.loading = "loading the model"  # what /ready's 503 says: what is happening, never where (the log says)
        try:
            with _LoadingNotes(self):  # e.g. building a variant on the first start
                classifier = await self.load_classifier(self.settings)
        except Exception as exc:
            # The operator gets the details in the log; clients only learn that it failed.
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("the model failed to load from %s: %s", self.settings.model_dir, self.load_error)
            self.metrics.ready.set(0)
            if self.on_fatal is not None:
                self.on_fatal(self.load_error)
            return
        await self.install(classifier, self.settings)
        if self.on_ready is not None:
            self.on_ready()

    async def load_classifier(self, settings: ServiceSettings) -> Classifier:
        """Build and warm up a classifier for ``settings`` in a thread (raises what loading raises)."""
        classifier = await asyncio.to_thread(self.factory, settings)
        if self.policy is not None:
            self.policy.check_heads(classifier.card.heads)  # a category the model lacks: refused, loudly
        if not self.ready:
            self.loading = "warming up"
        await asyncio.to_thread(classifier.warmup)
        if self.policy is not None:  # a large block list is built now, not in the first request's time
            await asyncio.to_thread(self.policy.prepare, classifier.card)
        return classifier

    async def install(self, classifier: Classifier, settings: ServiceSettings) -> MicroBatcher | None:
        """Serve ``classifier`` from now on with a fresh batcher; returns the previous batcher (the
        hot swap drains it: requests already admitted there finish on the old model)."""
        card = classifier.card
        bound = await asyncio.to_thread(_cost_bound, classifier, settings)  # its vocabulary and tables, read once
        batcher = MicroBatcher(
            classifier.encode,
            _counting_int8_checks(classifier, self.metrics),
            settings,
            gate=self.gate,
            observer=self.metrics,
            bound=bound.at_least,
            on_failed=self._batcher_failed,
        )
        await batcher.start()
        previous = self.batcher
        # no await from here on: requests see either the old model or the new one, never a mix
        self.settings = settings
        self.classifier = classifier
        self.served = ServedModel(classifier.model_id, card.threshold, batcher, card)
        self.load_error = None
        self.loading = None
        self.ready = True
        self.metrics.set_model(
            name=card.name, version=card.version, variant=str(classifier.variant), provider=str(classifier.provider)
        )
        self.metrics.ready.set(1)
        log.info(
            "ready: %s (variant %s, provider %s, %d inference workers, intra-op threads each: %d) from %s; "
            "operator policy: %s; admission budgets %d model tokens (classify), %d (explain)",
            self.model_id,
            classifier.variant,
            classifier.provider,
            classifier.workers,
            classifier.intra_op_threads,
            settings.model_dir,
            self.policy.source if self.policy is not None else "none (the model card's decisions)",
            self.gate.lane(CLASSIFY).budget,
            self.gate.lane(EXPLAIN).budget,
        )
        return previous

    def _batcher_failed(self, error: BaseException) -> None:
        """A batcher stopped on an error. The serving one: every request would get 503 from now on, so the service
        says it is not ready (``/ready``, ``safety_ready``), ``/health`` fails, and the server exits (``on_fatal``)
        for its supervisor to restart it, as for a model that cannot load. One a hot swap replaced (draining): the
        model now served is not affected (its batcher still runs); the error is in the log."""
        if self.batcher is not None and self.batcher.running:
            return
        self.ready = False
        self.load_error = f"the micro-batcher stopped: {type(error).__name__} (details in the server log)"
        self.metrics.ready.set(0)
        if self.on_fatal is not None:
            self.on_fatal(self.load_error)

    async def retire(self, batcher: MicroBatcher, timeout_s: float) -> bool:
        """Drain a batcher :meth:`install` replaced (its requests in flight finish on its model), then stop it; True
        if all finished in time. Until then :meth:`stop` stops it too."""
        self._retiring.add(batcher)
        try:
            return await batcher.drain(timeout_s)
        finally:
            self._retiring.discard(batcher)

    async def stop(self) -> None:
        self.ready = False
        self.metrics.ready.set(0)
        batchers = [*self._retiring, *([self.batcher] if self.batcher is not None else [])]
        await asyncio.gather(*(b.stop() for b in batchers))

    def require_ready(self) -> MicroBatcher:
        return self.require_served().batcher

    def require_served(self) -> ServedModel:
        """The model serving now (what a new request is admitted to), or NotReady."""
        if self.load_error is not None:
            raise NotReady(
                "the model cannot serve (it failed to load, or its batcher stopped on an error); the operator must "
                "fix it (details in the server log)",
                code="model_failed",
                retry_after_s=self.settings.retry_after_s,
            )
        if not self.ready or self.served is None:
            doing = f" ({self.loading})" if self.loading else ""
            raise NotReady(f"the model is not ready yet{doing}; retry later", retry_after_s=self.settings.retry_after_s)
        return self.served

    def early_refusal(self, scope: Scope) -> ServiceError | None:
        """The 429 a classification request (``POST`` to :data:`EARLY_REFUSED_PATHS`) to a ready service gets
        before its body is read: the admission rule for one more token of work from its client (the classify
        lane or the client's share of it is full). None: the request goes on, to :meth:`score`."""
        if scope["method"] != "POST" or scope["path"] not in EARLY_REFUSED_PATHS or not self.ready:
            return None
        served = self.served
        if served is None:
            return None
        try:
            served.batcher.admission(http_client(scope))
        except ServiceError as refusal:
            return refusal
        return None

    async def score(
        self,
        examples: Sequence[Example],
        *,
        client: str,
        explain: Method | None = None,
        explain_history: bool = False,
        hangup: Receive | None = None,
    ) -> Scored | None:
        """The one door to the model: every endpoint (classify, batch, messages, conversation, moderations,
        explanations, the break-it game's live score) scores its examples here. They go to the serving
        model's batcher, charged once to ``client`` (the batcher's admission: 413 or 429 before anything is
        queued), in the classify lane, or, with ``explain`` (a method, one example), as the sequences of its
        explanation in the explain lane (``explain_history``: the history's words explained too). Per example
        its prediction, or the :class:`InvalidInput` it was refused with (``too_many_windows``: its ``field``
        names the item's own utterance, the caller adds where it sits), and the model that made them (a hot
        swap may install another meanwhile; the request keeps this one).
        ``hangup``: the HTTP request's ``receive``: when the client disconnects first, its items are dropped
        before inference (their charge given back) and None is returned."""
        served = self.require_served()
        if not examples:
            return Scored([], served)
        plan: Plan | None = None
        lane, at_least = CLASSIFY, None
        if explain is not None:
            [example] = examples
            plan, at_least = await self._plan(served, example, explain, explain_history)
            examples, lane = plan.examples(), EXPLAIN
        batcher = served.batcher
        futures = await batcher.enqueue(examples, client=client, lane=lane, at_least=at_least, entered=plan is not None)
        # a lone item is awaited as it is (the lone request's path adds no gather)
        waiter: asyncio.Future[Any] = (
            futures[0] if len(futures) == 1 else asyncio.gather(*futures, return_exceptions=True)
        )
        watcher = asyncio.ensure_future(_until_disconnect(hangup)) if hangup is not None else None
        try:
            await asyncio.wait([waiter] if watcher is None else (waiter, watcher), return_when=asyncio.FIRST_COMPLETED)
            answered = waiter.done()  # decided here: a cancelled gather() is not done() until a later loop turn
        finally:
            if watcher is not None:
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
        if plan is None:
            return Scored(outcomes, served)
        predictions = predictions_of(outcomes)  # an explanation's sequences stand or fall together
        return Scored(outcomes, served, plan.explanation([p.score for p in predictions]))

    async def _plan(self, served: ServedModel, example: Example, method: Method, history: bool) -> tuple[Plan, int]:
        """The explanation of ``example`` that fits one request of the explain lane (as many sequences as half
        its budget holds at this example's cost: a masked sequence costs no more than the example, two at
        least), and what it costs at least (two sequences: more than one request may cost is a 413)."""
        [encoded] = await served.batcher.encode([example])
        sequences = served.batcher.gate.lane(EXPLAIN).max_request_tokens // max(1, encoded.tokens)
        plan = explain_plan(example, max(2, sequences), history=history, method=method)
        return plan, 2 * encoded.tokens

    def check_item(self, utterance: str, turns: Sequence[str]) -> None:
        """The request limits for one message (raises InvalidInput): what the break-it game checks a draft by."""
        self.limits.check_item(utterance, turns)

    def load_model(self, model_dir: Path) -> Classifier:
        """Another model directory, loaded like the served one (the same factory and settings; call in a thread)."""
        return self.factory(self.settings.model_copy(update={"model_dir": model_dir}))

    @property
    def default_threshold(self) -> float | None:
        """The threshold for requests that bring none: the setting, else the card's (None before a load)."""
        if self.card_threshold is None:
            return None
        return threshold_in_force(self.card_threshold, self.settings.threshold)

    async def decide_all(
        self,
        decisions: Sequence[tuple[Prediction, Example, float | None]],
        request_threshold: float | None = None,
        *,
        served: ServedModel,
        policy: Policy | None | _InForce = IN_FORCE,
    ) -> list[dict[str, Any]]:
        """:meth:`decide` for each (prediction, example judged, item threshold) of one request, all under one
        policy: ``policy``, by default the one in force now (a caller that reads the policy again to shape its
        answer passes the one it read, so that a reload meanwhile cannot mix two). When its rules read texts
        (allow and block rules), the matching runs in a worker thread: it is this request's work, never the
        event loop's."""
        policy = self.policy if isinstance(policy, _InForce) else policy

        def decide_each() -> list[dict[str, Any]]:
            return [
                self.decide(p, request_threshold, t, served=served, example=e, policy=policy) for p, e, t in decisions
            ]

        if policy is not None and policy.matches_text and decisions:
            return await asyncio.to_thread(decide_each)
        return decide_each()

    def decide(
        self,
        prediction: Prediction,
        request_threshold: float | None = None,
        item_threshold: float | None = None,
        *,
        served: ServedModel | None = None,
        example: Example | None = None,
        policy: Policy | None | _InForce = IN_FORCE,
    ) -> dict[str, Any]:
        """The answer for ``prediction`` made by ``served`` (default: the model serving now); with the
        ``example`` it judged, under the operator policy (default: the one in force; ``policy`` in the
        answer: the rule that decided)."""
        served = served or self.served
        if served is None:
            raise NotReady(retry_after_s=self.settings.retry_after_s)
        rules = self.policy if isinstance(policy, _InForce) else policy
        t = threshold_in_force(served.card_threshold, self.settings.threshold, request_threshold, item_threshold)
        if t != prediction.threshold:
            prediction = replace(
                prediction, label=Label.from_bool(bool(is_offensive(prediction.score, t))), threshold=t
            )
        if rules is not None and example is not None and served.card is not None:
            prediction = rules.apply(example, prediction, served.card)
        answer = {
            "label": prediction.label.value,
            "score": prediction.score,
            "threshold": prediction.threshold,
            "categories": dict(prediction.categories),
            **prediction.reading(),
        }
        if prediction.policy is not None:
            answer["policy"] = prediction.policy
        return answer


def state_of(request: Request) -> ServiceState:
    """The app's service state: the one way every route reaches it, as the FastAPI dependency :data:`State`
    (``app.state.safety``, set by :func:`dialogue_safety.service.app.create_app`)."""
    state: ServiceState = request.app.state.safety
    return state


#: a route's parameter annotated with it receives the app's :class:`ServiceState`
State = Annotated[ServiceState, Depends(state_of)]


#: the detail of a 503 while the first start derives the variant it serves (``dialogue_safety.core.variants``)
BUILDING_VARIANT = (
    "building the model's runtime variant for this machine (a first start with this model, recipe or onnxruntime "
    "version; later starts reuse it)"
)


class _LoadingNotes(logging.Handler):
    """While the first model loads, the loading code's notes (``dialogue_safety.core.variants``:
    "building the int8 variant of /path/to/model...") are logged at INFO even when the service logs less
    (a silent minute at first start looks like a hang), and turn the detail of every 503 into
    :data:`BUILDING_VARIANT`: what is happening, never the server's paths (those stay in the log)."""

    LOGGER = "dialogue_safety.core.variants"

    def __init__(self, state: ServiceState) -> None:
        super().__init__(logging.INFO)
        self.state = state
        self.logger = logging.getLogger(self.LOGGER)
        self.level_before = self.logger.level

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.INFO:
            self.state.loading = BUILDING_VARIANT

    def __enter__(self) -> _LoadingNotes:
        self.logger.addHandler(self)
        if not self.logger.isEnabledFor(logging.INFO):
            self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)


def _cost_bound(classifier: Classifier, settings: ServiceSettings) -> CostBound:
    """The classifier's cost bounds before tokenising, with what its tokenizer tells of a text's tokens (none
    when it shows no tokenizer: no lower bound but 0): built in a worker thread when a model is installed."""
    tokenizer = getattr(getattr(classifier, "encoder", None), "tokenizer", None)
    words = TokenizerWords.of(tokenizer) if tokenizer is not None else None
    return CostBound(classifier.card.encoding_config, settings.max_windows, words)
