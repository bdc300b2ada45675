"""The latency estimator behind the micro-batcher's admission: how fast batches run, how long a new
item would wait, and what may still be admitted or served in time. Plain arithmetic over what the
batcher reports (no asyncio, no clock but ``time.perf_counter``), so it is tested on its own.

Admission is bounded by time, not only by items: with ``max_queue_wait_s`` set, the estimator keeps
a running estimate of the throughput (seconds per token, from the batches that ran) and the batcher
refuses a submission at once (429) when the tokens already queued would take longer than that to
clear. The promise to an accepted item is an answer within ``max_queue_wait_s`` plus one batch
(:attr:`LatencyEstimator.latency_bound_s`; one batch: the running mean time of the batches at least
half full). When a batch forms, an item that could no longer get its answer in time is refused
instead of being served late: one that waited longer than ``max_queue_wait_s``, or whose wait plus
this batch's predicted time (its padded tokens at the measured speed, times the worst ratio of
actual to predicted time over the recent batches at least half full, within ``SLOWNESS_WINDOW_S``
and at most ``MAX_SLOWNESS``, plus the event loop's lag in taking results back) would pass the
bound. On a core shared with a busy event loop a batch of the same tokens takes up to ~2.5x longer
than on an idle one, so the prediction errs by tens of percent and the margin must be measured,
not assumed. Items that waited less than half of ``max_queue_wait_s`` are always run (progress
before promise: if the machine turns very slow, fresh items are still served), and a submission
of more items than one batch is not held to the bound for the time its own first batches take.

Unless the operator sets it, ``max_queue_wait_s`` itself follows the machine:
:func:`default_queue_wait_s` (at least ``QUEUE_WAIT_BATCHES`` full batches as measured at warm-up by
:func:`measure_full_batch_s`, and at least ``MIN_QUEUE_WAIT_S``), and, as batches run, at least
``QUEUE_WAIT_BATCHES`` full batches at the speed they run now, as late as the recent batches ran against their
prediction (the slowness the admission charges) plus the event loop's lag (``follow_machine``): at warm-up the
machine is idle, under load the clients, the event loop and the encoding share its cores (an AVX2-only 2-core
EPYC under ``bench http``: 730–865 ms for a full batch under load against 514–650 ms at warm-up, and 8 of 30
polite 32-item batches refused with the warm-up's bound alone), so that polite clients at capacity are not
refused on a slow machine (the docs' rule: keep the bound at three full batches or more). The slowness belongs
in it: admission admits an item when (its expected wait + one batch) x slowness + lag fits the bound, so with
64 closed-loop clients and batches of 64 (up to two batches ahead of an item) a bound of three batches without
it refused 7–20 of ~650 requests at c=64 whenever batches ran 1.3x their prediction. It never drops under the
warm-up's bound and never rises over ``MAX_SLOWNESS`` times it; a stalled batch (over ``MAX_SLOWNESS`` times its
prediction) is no measure of the machine and moves neither its full batch nor its slowness; after
``SLOWNESS_WINDOW_S`` without a batch at least half full, its excess over the warm-up's bound, as it stood at the
last such batch, halves every ``BOUND_HALF_LIFE_S`` (light traffic between bursts does not throw away what the
last burst measured; a machine that turned fast forgets it within minutes).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from dialogue_safety.core.batch_budget import token_budget_batches
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.schema import Example, Prediction, Turn
from dialogue_safety.service.errors import Overloaded

RECENT_BATCHES = 32  # batches whose slowness and loop lag bound the next prediction (~5 s under load)
SLOWNESS_WINDOW_S = 10.0  # a batch's slowness counts this long (then light traffic forgets one stall)
MAX_SLOWNESS = 3.0  # the slowness factor at most (a stall must not make every estimate absurd)
TYPICAL_ITEM_TOKENS = 64.0  # tokens per item assumed before any was encoded
MIN_QUEUE_WAIT_S = 1.0  # the queue-wait bound at least, when derived from the machine
QUEUE_WAIT_BATCHES = 3  # ... and at least this many full batches as measured at warm-up
BOUND_HALF_LIFE_S = 60.0  # a followed bound's excess over the warm-up's, without load: halves this often


class LatencyEstimator:
    """Running estimates of one batcher's speed, and the admission rules built on them.

    ``max_batch_size``: a full batch (batches under half of it do not count as "one batch");
    ``max_queue_wait_s``: how long an accepted item may wait (None: no time bound)."""

    def __init__(self, max_batch_size: int, max_queue_wait_s: float | None, *, follow_machine: bool = False) -> None:
        self.max_batch_size = max_batch_size
        self._queue_wait_s = max_queue_wait_s  # the setting, or the warm-up's bound (max_queue_wait_s)
        # a bound derived from the machine (SAFETY_MAX_QUEUE_WAIT_MS unset) keeps following it: at least
        # QUEUE_WAIT_BATCHES full batches at the speed batches run now, never under the warm-up's bound
        self.follow_machine = follow_machine and max_queue_wait_s is not None
        self.full_batch_s: float | None = None  # running mean time of a full batch (batches at least half full, scaled)
        self.full_batch_at = 0.0  # perf_counter() when the last batch at least half full updated it
        self._followed_s = 0.0  # the followed bound that batch set (what it decays from without load)
        self.seconds_per_token: float | None = None  # EWMA over the batches run so far
        self.item_tokens = TYPICAL_ITEM_TOKENS  # running mean of tokens per item (items not encoded yet)
        self.encode_seconds_per_item = 0.0  # running mean of encoding time per item
        self.batch_s: float | None = None  # running mean time of the batches at least half full: "one batch"
        self.last_batch_s = 0.0  # how long the last batch took
        # (perf_counter, actual / predicted time) of the recent batches at least half full
        self.slowness: deque[tuple[float, float]] = deque(maxlen=RECENT_BATCHES)
        self.loop_lag: deque[float] = deque(maxlen=RECENT_BATCHES)  # inference end -> the loop takes the results
        self.running_tokens = 0  # padded tokens of the batch running now (0: none)
        self.running_since = 0.0  # perf_counter() when it started

    # -- learning -------------------------------------------------------------------------------
    def learn_item(self, tokens: int) -> None:
        self.item_tokens = 0.9 * self.item_tokens + 0.1 * tokens

    def learn_encoding(self, seconds: float, items: int) -> None:
        if items:
            self.encode_seconds_per_item = 0.9 * self.encode_seconds_per_item + 0.1 * seconds / items

    def started(self, padded: int) -> float:
        """A batch of ``padded`` tokens starts now (``perf_counter``, returned); it counts in the
        expected wait until it :meth:`ended`."""
        self.running_tokens, self.running_since = padded, time.perf_counter()
        return self.running_since

    def ended(self) -> None:
        self.running_tokens = 0

    def learn_batch(self, items: int, padded: int, elapsed: float, predicted: float | None, lag: float = 0.0) -> bool:
        """Update the throughput, one batch's time and the slowness after a batch of ``items`` items
        (``padded`` tokens) ran in ``elapsed`` s (``predicted`` before it ran; ``lag``: the event
        loop's delay in taking its results). True when "one batch" (and so the bound) changed."""
        self.loop_lag.append(max(0.0, lag))
        self.last_batch_s = elapsed
        fullness = min(1.0, items / self.max_batch_size)
        per_token = elapsed / max(1, padded)
        old = self.seconds_per_token
        # Weighted by how full the batch was: the estimate is for a long queue, which runs in full
        # batches; a lone request costs ~3x more per token and must not make the next burst look slow.
        weight = 0.2 * fullness
        self.seconds_per_token = per_token if old is None else (1 - weight) * old + weight * per_token
        if fullness < 0.5:  # small batches: mostly fixed cost, neither "one batch" nor a fair test of the estimate
            return False
        self.batch_s = elapsed if self.batch_s is None else 0.8 * self.batch_s + 0.2 * elapsed
        stalled = predicted is not None and predicted > 0 and elapsed > predicted * MAX_SLOWNESS  # no measure of speed
        if predicted:
            self.slowness.append((time.perf_counter(), elapsed / predicted))
        if not stalled:
            full = elapsed / fullness  # a batch of this traffic, full
            self.full_batch_s = full if self.full_batch_s is None else 0.8 * self.full_batch_s + 0.2 * full
            self.full_batch_at = time.perf_counter()
            # the followed bound, computed here once per batch (admission reads it for every submission):
            # three full batches at this speed, times the recent slowness (stalls left out), plus the loop's lag
            slowness = self.slowness_factor(without_stalls=True)
            self._followed_s = QUEUE_WAIT_BATCHES * self.full_batch_s * slowness + max(self.loop_lag, default=0.0)
        return True

    @property
    def max_queue_wait_s(self) -> float | None:
        """How long an accepted item may wait (None: no time bound). Derived from the machine
        (``follow_machine``): the warm-up's bound, or, if longer, the bound as the last batch at least half full
        set it (``QUEUE_WAIT_BATCHES`` full batches at the speed batches of the current traffic run, times their
        recent slowness, plus the loop's lag); at most ``MAX_SLOWNESS`` times the warm-up's bound; without such a
        batch for ``SLOWNESS_WINDOW_S``, the excess over the warm-up's bound halves every ``BOUND_HALF_LIFE_S``."""
        floor = self._queue_wait_s
        if not self.follow_machine or floor is None or self.full_batch_s is None:
            return floor
        excess = max(0.0, min(MAX_SLOWNESS * floor, self._followed_s) - floor)
        idle = time.perf_counter() - self.full_batch_at - SLOWNESS_WINDOW_S
        return floor + (excess if idle <= 0 else excess * 0.5 ** (idle / BOUND_HALF_LIFE_S))

    # -- predicting -----------------------------------------------------------------------------
    def predict_s(self, padded_tokens: int) -> float | None:
        """The time a batch of ``padded_tokens`` should take at the measured speed (None: not measured)."""
        spt = self.seconds_per_token
        return None if spt is None else padded_tokens * spt

    def expected_wait_s(self, queued_tokens: int = 0, to_encode: int = 0) -> float | None:
        """How long a new item would wait for its batch to start: what is left of the running batch
        (:meth:`started`), then ``to_encode`` items still to be encoded (one encoding thread: they wait
        in turn) and the ``queued_tokens``, at the measured throughput (None: not measured yet)."""
        spt = self.seconds_per_token
        if spt is None:
            return None
        running = 0.0
        if self.running_tokens:
            running = max(0.0, self.running_tokens * spt - (time.perf_counter() - self.running_since))
        encoding = to_encode * self.encode_seconds_per_item
        return running + encoding + (queued_tokens + to_encode * self.item_tokens) * spt

    @property
    def latency_bound_s(self) -> float | None:
        """The answer time promised to an accepted item: ``max_queue_wait_s`` plus one batch; None
        without ``max_queue_wait_s`` or before a batch at least half full ran."""
        if self.max_queue_wait_s is None or self.batch_s is None:
            return None
        return self.max_queue_wait_s + self.batch_s

    def slowness_factor(self, *, without_stalls: bool = False) -> float:
        """The worst ratio of actual to predicted batch time over the recent batches at least half full
        (the last ``RECENT_BATCHES`` within ``SLOWNESS_WINDOW_S``), between 1 and ``MAX_SLOWNESS``;
        ``without_stalls``: leaving out stalled batches (over ``MAX_SLOWNESS`` times their prediction)."""
        since = time.perf_counter() - SLOWNESS_WINDOW_S
        recent = (r for at, r in self.slowness if at >= since and not (without_stalls and r > MAX_SLOWNESS))
        return min(MAX_SLOWNESS, max(1.0, max(recent, default=1.0)))

    def late_after_s(self, padded_tokens: int) -> float | None:
        """How long an item of a batch of ``padded_tokens`` about to run may have waited
        (:meth:`wait_limit_s` for its predicted time)."""
        return self.wait_limit_s(self.predict_s(padded_tokens))

    def wait_limit_s(self, batch_s: float | None, slowness: float | None = None) -> float | None:
        """How long an item may wait and still be answered within :attr:`latency_bound_s` by a batch
        predicted to take ``batch_s`` once it starts (None: no limit): the bound less that time times
        the worst recent slowness (``slowness`` when the caller has it already) and the event loop's
        lag; at most ``max_queue_wait_s``, at least half of it (so that fresh items always run)."""
        limit = self.max_queue_wait_s
        bound = self.latency_bound_s
        if limit is None or bound is None or batch_s is None:
            return limit
        slowness = self.slowness_factor() if slowness is None else slowness
        finish = batch_s * slowness + max(self.loop_lag, default=0.0)
        return max(limit / 2, min(limit, bound - finish))

    def refusal(self, expected_s: float, retry_after_s: int) -> Overloaded | None:
        """The refusal of an item expected to wait ``expected_s`` (at the measured speed) if it must be
        refused now; None: admit. The limit is the one its batch will apply (for a
        typical batch) less headroom for the estimate's error: refused now, fast, rather than after
        waiting. The headroom is one batch, at most half the limit, so that an idle batcher always
        admits (one very long batch must not refuse the next requests for ever)."""
        slowness = self.slowness_factor()
        limit = self.wait_limit_s(self.batch_s, slowness)
        if limit is None:
            return None
        headroom = min(self.batch_s if self.batch_s is not None else self.last_batch_s, limit / 2)
        expected = expected_s * slowness  # the queued work is predicted like a batch: as slow as lately
        if expected + headroom <= limit:
            return None
        return Overloaded(
            f"an item admitted now would wait about {expected * 1000:.0f} ms for inference; with one batch of "
            f"headroom that is more than the {limit * 1000:.0f} ms it may wait to be answered within "
            f"SAFETY_MAX_QUEUE_WAIT_MS ({(self.max_queue_wait_s or 0) * 1000:.0f} ms) plus one batch; retry later",
            retry_after_s=retry_after_s,
        )

    def too_late(self, waited_s: float, retry_after_s: int) -> Overloaded:
        """The refusal of an item that waited ``waited_s`` and could no longer be answered in time."""
        return Overloaded(
            f"this request waited {waited_s * 1000:.0f} ms for inference: too long to be answered within "
            f"SAFETY_MAX_QUEUE_WAIT_MS ({(self.max_queue_wait_s or 0) * 1000:.0f} ms) plus one batch; retry later",
            retry_after_s=retry_after_s,
        )

    def own_waits(self, chunk_tokens: Sequence[tuple[int, int]]) -> list[float]:
        """For the items of one submission cut in batches (``(items, padded tokens)`` per batch), the
        predicted time of the submission's own batches ahead of each item (a request of more items
        than one batch waits for its own first batches: that is not waiting for others)."""
        spt = self.seconds_per_token
        if len(chunk_tokens) <= 1 or spt is None:
            return [0.0] * sum(items for items, _ in chunk_tokens)
        waits: list[float] = []
        ahead, slowness = 0.0, self.slowness_factor()
        for items, padded in chunk_tokens:
            waits += [ahead] * items
            ahead += padded * spt * slowness
        return waits


def default_queue_wait_s(full_batch_s: float | None) -> float:
    """``max_queue_wait_s`` when the operator sets none: at least ``QUEUE_WAIT_BATCHES`` full batches
    (``full_batch_s``, measured at warm-up) and at least ``MIN_QUEUE_WAIT_S``."""
    if full_batch_s is None:
        return MIN_QUEUE_WAIT_S
    return max(MIN_QUEUE_WAIT_S, QUEUE_WAIT_BATCHES * full_batch_s)


def typical_example() -> Example:
    """A dialogue of about ``TYPICAL_ITEM_TOKENS`` tokens (two short turns and a reply)."""
    return Example(
        utterance="honestly I think that is a terrible idea and you should not do it again, nobody liked it",
        history=(
            Turn("I was thinking of painting the whole house bright orange this weekend, what do you say?"),
            Turn("that sounds like a lot of work; have you asked your family about the colour first?"),
        ),
    )


def measure_full_batch_s(
    encode: Callable[[Sequence[Example]], list[EncodedExample]],
    predict: Callable[[list[EncodedExample]], list[Prediction]],
    max_batch_size: int,
    max_batch_tokens: int,
    rounds: int = 2,
) -> float:
    """Seconds one full batch of typical dialogues takes (``max_batch_size`` items, run in the calls of
    ``max_batch_tokens`` the batcher makes), the fastest of ``rounds``. Call in a thread, after
    warm-up: at start it blocks for a few batches."""
    encoded = encode([typical_example()] * max_batch_size)
    widths, rows = [e.width for e in encoded], [len(e.rows) for e in encoded]  # as the batcher cuts them
    calls = [list(c) for c in token_budget_batches(widths, max_batch_tokens, max_batch_size, rows)]
    best = float("inf")
    for _ in range(max(1, rounds)):
        start = time.perf_counter()
        for call in calls:
            predict([encoded[i] for i in call])
        best = min(best, time.perf_counter() - start)
    return best
