"""Prometheus metrics (``safety_`` prefix), one registry per app so that apps and tests never collide.

:class:`ServiceMetrics` owns the collectors; :class:`RequestMetricsMiddleware` (pure ASGI, cheap)
counts requests by route template and status and times them; the batcher reports queue,
batch, tokenisation and inference figures through the ``BatchObserver`` methods.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dialogue_safety.core.schema import Reading

PREFIX = "safety"
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WINDOW_BUCKETS = (1, 2, 4, 8, 16, 32)
TOKEN_BUCKETS = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class ServiceMetrics:
    """Every series the service exposes, registered in its own registry."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "HTTP requests by route template and status", ["route", "status"], registry=r
        )
        self.request_latency = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "HTTP request latency (server side)",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "items waiting for an inference batch", registry=r)
        self.admission_budget = Gauge(
            f"{PREFIX}_admission_budget_tokens",
            "the work an admission lane holds at most, in model tokens (tokens x windows x passes): "
            "max_pending_tokens (classify), max_explain_tokens (explain)",
            ["lane"],
            registry=r,
        )
        self.admission_charged = Gauge(
            f"{PREFIX}_admission_charged_tokens",
            "work admitted to a lane and not answered yet (waiting and running), in model tokens",
            ["lane"],
            registry=r,
        )
        self.request_cost = Histogram(
            f"{PREFIX}_request_cost_tokens",
            "the work one admitted request was charged, in model tokens (tokens x windows x passes)",
            ["lane"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.admission_refused = Counter(
            f"{PREFIX}_admission_refused",
            "requests refused by admission, by lane and reason: busy (the lane is full, 429), fair_share (the client "
            "holds its share, 429), too_costly (more than half the lane, 413)",
            ["lane", "reason"],
            registry=r,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "time an item waits from submit to the start of its batch",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size",
            "rows per inference call (windows, utterance-alone rows)",
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            f"{PREFIX}_batch_tokens",
            "padded tokens per inference call (rows x longest; each window of a long utterance is a row)",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.inference_time = Histogram(
            f"{PREFIX}_inference_seconds",
            "time of one inference call (row_logits)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tokenization_time = Histogram(
            f"{PREFIX}_tokenization_seconds",
            "time to encode one submission (all its items)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.predictions = Counter(f"{PREFIX}_predictions", "predictions by label", ["label"], registry=r)
        self.item_windows = Histogram(
            f"{PREFIX}_item_windows",
            "windows a classified utterance was read in (1: it fits the model's input; more: a long message)",
            buckets=WINDOW_BUCKETS,
            registry=r,
        )
        self.truncated = Counter(
            f"{PREFIX}_truncated_items",
            "classified items of which part was not read, by what: utterance (the window cap) or history (turns "
            "the token budget dropped)",
            ["part"],
            registry=r,
        )
        self.unsupported_language = Counter(
            f"{PREFIX}_unsupported_language_items",
            "classified items whose utterance is confidently in a language the model does not read (it is "
            "English-only), by language (ISO 639-1); the verdict is still returned",
            ["language"],
            registry=r,
        )
        self.dropped = Counter(
            f"{PREFIX}_dropped_items",
            "items dropped before inference because their caller went away (hung up or cancelled)",
            registry=r,
        )
        self.batch_failures = Counter(f"{PREFIX}_batch_failures", "inference batches that failed", registry=r)
        self.int8_checked = Counter(
            f"{PREFIX}_int8_checked_items",
            "classified items the int8 variant scored near a threshold and that were scored again with fp32 (the "
            "model card's int8 check; their answer is fp32's)",
            registry=r,
        )
        self.ready = Gauge(f"{PREFIX}_ready", "1 when the model is loaded and warmed up", registry=r)
        self.model_info = Info(f"{PREFIX}_model", "the model being served", registry=r)

    # -- what the app reports -------------------------------------------------------------
    def set_model(self, *, name: str, version: str, variant: str, provider: str) -> None:
        self.model_info.info({"name": name, "version": version, "variant": variant, "provider": provider})

    def count_labels(self, labels: list[str]) -> None:
        for label in labels:
            self.predictions.labels(label=label).inc()

    def count_reads(self, reads: Iterable[Reading]) -> None:
        """What the model read of the classified items: windows, truncation, unsupported languages."""
        for read in reads:
            self.item_windows.observe(read.windows)
            if read.utterance_chars_unread:
                self.truncated.labels(part="utterance").inc()
            if read.history_turns_dropped:
                self.truncated.labels(part="history").inc()
            if read.language is not None and read.language_supported is False:
                self.unsupported_language.labels(language=read.language).inc()

    # -- what the batcher reports (dialogue_safety.service.batcher.BatchObserver) -----------------------------
    def observe_queue_depth(self, depth: int) -> None:
        self.queue_depth.set(depth)

    def observe_queue_wait(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def observe_tokenization(self, seconds: float) -> None:
        self.tokenization_time.observe(seconds)

    def observe_batch(self, size: int, padded_tokens: int, seconds: float) -> None:
        self.batch_size.observe(size)
        self.batch_tokens.observe(padded_tokens)
        self.inference_time.observe(seconds)

    def observe_dropped(self, n: int) -> None:
        self.dropped.inc(n)

    def observe_batch_failure(self) -> None:
        self.batch_failures.inc()

    # -- what admission reports (dialogue_safety.service.admission.AdmissionObserver) ----------------------
    def set_budgets(self, budgets: dict[str, int]) -> None:
        for lane, tokens in budgets.items():
            self.admission_budget.labels(lane=lane).set(tokens)
            self.admission_charged.labels(lane=lane).set(0)

    def observe_charged(self, lane: str, tokens: int) -> None:
        self.admission_charged.labels(lane=lane).set(tokens)

    def observe_admitted(self, lane: str, cost: int) -> None:
        self.request_cost.labels(lane=lane).observe(cost)

    def observe_refused(self, lane: str, reason: str) -> None:
        self.admission_refused.labels(lane=lane, reason=reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetricsMiddleware:
    """Counts and times every HTTP request by route template (never the raw path) and status. A request refused
    before routing (401, 413, 415, the early 429) is counted under its route when its path is one of the API's
    paths without parameters; any other path is ``unmatched`` (the labels stay a fixed set whatever clients send)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self._fixed_paths: frozenset[str] | None = None  # the app's route paths without parameters, read once

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            path = getattr(scope.get("route"), "path", None) or self._fixed_path(scope)
            self.metrics.requests.labels(route=path, status=str(status)).inc()
            self.metrics.request_latency.labels(route=path).observe(time.perf_counter() - start)

    def _fixed_path(self, scope: Scope) -> str:
        if self._fixed_paths is None:  # the API's paths without parameters, from its OpenAPI schema (built once)
            openapi = getattr(scope.get("app"), "openapi", None)
            paths = openapi().get("paths", {}) if callable(openapi) else {}
            self._fixed_paths = frozenset(p for p in paths if "{" not in p)
        return scope["path"] if scope["path"] in self._fixed_paths else "unmatched"
