"""What one app owns: the settings, limits and metrics, and the model it serves (classifier and batcher).

:class:`ServiceState` loads and warms up the model, installs it with a fresh micro-batcher (a hot
swap installs the next one beside it: :mod:`dialogue_safety.service.hot_swap`), decides answers at
the threshold in force, and refuses early what an overloaded batcher would refuse. The API
(:mod:`dialogue_safety.service.app`), the hot swap and the break-it game it mounts (as its
:class:`dialogue_safety.breakit.api.Host`) all work through it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from dialogue_safety.core import explain
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import NotReady
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import Policy, load_policy
from dialogue_safety.core.schema import Example, Label, Prediction
from dialogue_safety.core.scoring import is_offensive, threshold_in_force
from dialogue_safety.service.auth import api_key_of, key_matches
from dialogue_safety.service.batcher import LONE_INLINE_CHARS, Announcement, MicroBatcher, PredictFn
from dialogue_safety.service.errors import Overloaded
from dialogue_safety.service.latency import (
    MIN_QUEUE_WAIT_S,
    QUEUE_WAIT_BATCHES,
    default_queue_wait_s,
    measure_full_batch_s,
)
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.telemetry import ServiceMetrics

log = logging.getLogger("dialogue_safety.service.state")
CLASSIFY_PATHS = frozenset({"/v1/classify", "/v1/classify/batch"})  # what an overloaded service refuses early
ANNOUNCEMENT = "safety.announcement"  # scope key: the batcher's Announcement of a request admitted from its head


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
    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]: ...
    def predict_encoded(
        self, encoded: Sequence[EncodedExample], threshold: float | None = None
    ) -> list[Prediction]: ...
    def warmup(self) -> object: ...


ClassifierFactory = Callable[[ServiceSettings], Classifier]


def load_onnx_classifier(settings: ServiceSettings) -> Classifier:
    from dialogue_safety.core.runtime import OnnxClassifier  # imported here: tests and --help never load onnxruntime

    kwargs: dict[str, Any] = {
        "variant": settings.variant,
        "providers": settings.provider_list,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_size": settings.max_batch_size,
        "derive_in_subprocess": True,  # a derived variant's peak memory stays in a child process
        "max_windows": settings.max_windows,
        "language_check": settings.language_check,
        "thresholds": () if settings.threshold is None else (settings.threshold,),
    }
    if settings.intra_op_threads is not None:
        kwargs["intra_op_threads"] = settings.intra_op_threads
    if settings.allow_spinning is not None:
        kwargs["allow_spinning"] = settings.allow_spinning
    classifier: Classifier = OnnxClassifier(settings.model_dir, **kwargs)
    return classifier


def _counting_int8_checks(classifier: Classifier, metrics: ServiceMetrics) -> PredictFn:
    """``classifier.predict_encoded``, counting the dialogues its int8 check scored again with fp32
    (``safety_int8_checked_items_total``); the classifier itself unless it has a check."""
    if not getattr(classifier, "check_band", 0.0):
        return classifier.predict_encoded

    def predict(encoded: list[EncodedExample]) -> list[Prediction]:
        before = int(getattr(classifier, "checked_items", 0))
        predictions = classifier.predict_encoded(encoded)
        metrics.int8_checked.inc(int(getattr(classifier, "checked_items", 0)) - before)
        return predictions

    return predict


@dataclass(frozen=True)
class ServedModel:
    """The model a request is admitted to, installed in one step: the batcher that scores it and the
    id and card threshold of the classifier behind that batcher. A request keeps the one it was
    admitted to, so a request queued before a hot swap is scored by the old model and answered with
    the old model's id and threshold."""

    model_id: str
    card_threshold: float
    batcher: MicroBatcher
    full_batch_s: float | None = None  # one full batch as measured at warm-up (None: not measured)
    card: ModelCard | None = None  # the classifier's card (what an operator policy reads: heads, normalisation)


class ServiceState:
    """What one app owns: settings, limits, metrics, and (once loaded) classifier and batcher."""

    def __init__(
        self,
        settings: ServiceSettings,
        factory: ClassifierFactory,
        on_fatal: Callable[[], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.on_fatal = on_fatal  # called when the model cannot load: the CLI stops the server (exit status 3)
        self.on_ready = (
            on_ready  # called once the first model serves: the CLI freezes the heap (dialogue_safety.service.memory)
        )
        self.factory = factory
        self.limits = settings.limits
        self.metrics = ServiceMetrics()
        self.classifier: Classifier | None = None
        self.served: ServedModel | None = None  # None before the load: no placeholder id or threshold
        self.ready = False
        self.load_error: str | None = None
        self.loading: str | None = None  # what the first load is doing now (the detail of /ready's 503)
        self.api_key = api_key_of(settings)
        # the operator's rules (SAFETY_POLICY): replaced whole by POST /admin/policy, never changed in place
        self.policy: Policy | None = load_policy(settings.policy) if settings.policy is not None else None

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
        self.loading = f"loading the model from {self.settings.model_dir}"
        try:
            with _LoadingNotes(self):  # e.g. building a variant on the first start
                classifier = await self.load_classifier(self.settings)
        except Exception as exc:
            # The operator gets the details in the log; clients only learn that it failed.
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("the model failed to load from %s: %s", self.settings.model_dir, self.load_error)
            self.metrics.ready.set(0)
            if self.on_fatal is not None:
                self.on_fatal()
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
        return classifier

    async def install(self, classifier: Classifier, settings: ServiceSettings) -> MicroBatcher | None:
        """Serve ``classifier`` from now on with a fresh batcher; returns the previous batcher (the
        hot swap drains it: requests already admitted there finish on the old model)."""
        s = settings
        card = classifier.card
        if not self.ready and s.max_queue_wait_s is None:
            self.loading = f"timing a full batch of {s.max_batch_size} (SAFETY_MAX_QUEUE_WAIT_MS unset)"
        full_batch_s = None if s.max_queue_wait_s is not None else await self.measure_full_batch(classifier, s)
        max_queue_wait_s = s.max_queue_wait_s if s.max_queue_wait_s is not None else default_queue_wait_s(full_batch_s)
        batcher = MicroBatcher(
            classifier.encode,
            _counting_int8_checks(classifier, self.metrics),
            s,
            max_queue_wait_s=max_queue_wait_s,
            observer=self.metrics,
            inline_lone_chars=LONE_INLINE_CHARS,
            follow_machine=s.max_queue_wait_s is None,
        )
        await batcher.start()
        previous = self.batcher
        # no await from here on: requests see either the old model or the new one, never a mix
        self.settings = settings
        self.classifier = classifier
        self.served = ServedModel(classifier.model_id, card.threshold, batcher, full_batch_s, card)
        self.load_error = None
        self.loading = None
        self.ready = True
        self.metrics.set_model(
            name=card.name, version=card.version, variant=str(classifier.variant), provider=str(classifier.provider)
        )
        self.metrics.ready.set(1)
        self.metrics.observe_latency_bound(0.0)  # the new batcher's promise, once its first full batch ran
        log.info(
            "ready: %s (variant %s, provider %s) from %s; queue-wait bound %.0f ms (%s)",
            self.model_id,
            classifier.variant,
            classifier.provider,
            s.model_dir,
            max_queue_wait_s * 1000,
            "SAFETY_MAX_QUEUE_WAIT_MS"
            if full_batch_s is None
            else f"{QUEUE_WAIT_BATCHES} full batches of {s.max_batch_size} at {full_batch_s * 1000:.0f} ms each, "
            f"at least {MIN_QUEUE_WAIT_S * 1000:.0f} ms",
        )
        return previous

    async def measure_full_batch(self, classifier: Classifier, settings: ServiceSettings) -> float | None:
        """One full batch of typical dialogues on ``classifier``, timed after its warm-up (in a thread);
        None when it cannot be measured (logged; the queue-wait bound then falls back to its minimum)."""
        try:
            return await asyncio.to_thread(
                measure_full_batch_s,
                classifier.encode,
                classifier.predict_encoded,
                settings.max_batch_size,
                settings.max_batch_tokens,
            )
        except Exception as exc:
            log.warning("could not time a full batch at warm-up (%s: %s)", type(exc).__name__, exc)
            return None

    async def stop(self) -> None:
        self.ready = False
        self.metrics.ready.set(0)
        if self.batcher is not None:
            await self.batcher.stop()

    def require_ready(self) -> MicroBatcher:
        return self.require_served().batcher

    def require_served(self) -> ServedModel:
        """The model serving now (what a new request is admitted to), or NotReady."""
        if self.load_error is not None:
            raise NotReady(
                "the model failed to load; the operator must fix it (details in the server log)",
                code="model_failed",
                retry_after_s=self.settings.retry_after_s,
            )
        if not self.ready or self.served is None:
            doing = f" ({self.loading})" if self.loading else ""
            raise NotReady(f"the model is not ready yet{doing}; retry later", retry_after_s=self.settings.retry_after_s)
        return self.served

    def refusing_batcher(self, method: str, path: str) -> MicroBatcher | None:
        """The early-refusal rule, the one place it is written: a classification request (``POST`` to
        ``CLASSIFY_PATHS``) to a ready service may be refused before its body is read, by the batcher
        returned here, when even one more item would be refused now (its queued work would take longer
        than the queue-wait bound, or the queue is full). None: the request goes on (requests that
        pass are checked again when queued)."""
        if method != "POST" or path not in CLASSIFY_PATHS or not self.ready:
            return None
        return self.batcher

    def early_refusal(self, method: str, path: str) -> Overloaded | None:
        """The 429 a request gets before its body is read (:meth:`refusing_batcher`), or None."""
        batcher = self.refusing_batcher(method, path)
        return None if batcher is None else batcher.refusal(1)

    def admit_from_head(
        self, method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]], scope: dict[str, Any]
    ) -> Overloaded | None:
        """:meth:`early_refusal` for the server's protocol (:mod:`dialogue_safety.service.server`), from the request
        head alone (``target``: the raw request target). A request that passes is announced to the
        batcher (counted in its wait estimate until it is queued; ``scope`` carries the
        announcement to the handler). Authenticated requests only (a wrong key still gets its 401
        from the app); the refusal is counted in the request metrics here."""
        route = target.partition(b"?")[0].decode("latin-1")
        batcher = self.refusing_batcher(method.decode("latin-1"), route)
        if batcher is None or (self.api_key is not None and not key_matches(headers, self.api_key)):
            return None
        start = time.perf_counter()
        verdict = batcher.announce()
        if isinstance(verdict, Announcement):
            scope[ANNOUNCEMENT] = verdict
            return None
        if verdict is not None:
            self.metrics.requests.labels(route=route, status="429").inc()
            self.metrics.request_latency.labels(route=route).observe(time.perf_counter() - start)
        return verdict

    # -- what the break-it game asks of its host (dialogue_safety.breakit.api.Host) -----------------
    def check_item(self, utterance: str, turns: Sequence[str]) -> None:
        """The request limits for one message (raises InvalidInput)."""
        self.limits.check_item(utterance, turns)

    async def score_deployed(self, example: Example) -> tuple[str, float, Label, float]:
        """The serving model's id, score, label and threshold for ``example``, through its batcher (the
        path of ``/v1/classify``; the model, id and threshold stay together across a hot swap)."""
        served = self.require_served()
        [prediction] = await served.batcher.submit([example])
        decided = self.decide(prediction, None, served=served)
        return served.model_id, float(decided["score"]), Label(decided["label"]), float(decided["threshold"])

    async def explain_deployed(self, example: Example, *, history: bool) -> tuple[str, float, Label, float, Any]:
        """:meth:`score_deployed` with the explanation of ``/v1/classify``'s ``explain`` (the same method
        and cap, every sequence through the batcher)."""
        served = self.require_served()
        plan = explain.plan_within(example, self.settings.queue_size, history=history)
        predictions = await served.batcher.submit(plan.examples())
        decided = self.decide(predictions[0], None, served=served)
        explanation = plan.explanation([p.score for p in predictions])
        label, threshold = Label(decided["label"]), float(decided["threshold"])
        return served.model_id, float(decided["score"]), label, threshold, explanation

    def load_model(self, model_dir: Path) -> Classifier:
        """Another model directory, loaded like the served one (the same factory and settings; call in a thread)."""
        return self.factory(self.settings.model_copy(update={"model_dir": model_dir}))

    @property
    def default_threshold(self) -> float | None:
        """The threshold for requests that bring none: the setting, else the card's (None before a load)."""
        if self.card_threshold is None:
            return None
        return threshold_in_force(self.card_threshold, self.settings.threshold)

    def decide(
        self,
        prediction: Prediction,
        request_threshold: float | None = None,
        item_threshold: float | None = None,
        *,
        served: ServedModel | None = None,
        example: Example | None = None,
    ) -> dict[str, Any]:
        """The answer for ``prediction`` made by ``served`` (default: the model serving now); with the
        ``example`` it judged, under the operator policy in force (``policy``: the rule that decided)."""
        served = served or self.served
        if served is None:
            raise NotReady(retry_after_s=self.settings.retry_after_s)
        t = threshold_in_force(served.card_threshold, self.settings.threshold, request_threshold, item_threshold)
        if t != prediction.threshold:
            prediction = replace(
                prediction, label=Label.from_bool(bool(is_offensive(prediction.score, t))), threshold=t
            )
        if self.policy is not None and example is not None and served.card is not None:
            prediction = self.policy.apply(example, prediction, served.card)
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


class _LoadingNotes(logging.Handler):
    """While the first model loads, what the loading code logs (``dialogue_safety.core.variants``:
    "building the int8 variant...") becomes the detail of ``/ready``'s 503, and is logged at INFO
    even when the service logs less (a silent minute at first start looks like a hang)."""

    LOGGER = "dialogue_safety.core.variants"

    def __init__(self, state: ServiceState) -> None:
        super().__init__(logging.INFO)
        self.state = state
        self.logger = logging.getLogger(self.LOGGER)
        self.level_before = self.logger.level

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.INFO:
            self.state.loading = record.getMessage()

    def __enter__(self) -> _LoadingNotes:
        self.logger.addHandler(self)
        if not self.logger.isEnabledFor(logging.INFO):
            self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)
