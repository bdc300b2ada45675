"""Micro-batching: concurrent requests merged into inference batches, off the event loop.

An ``asyncio.Queue`` of pending items (an encoded example and the future its caller awaits),
bounded: a submission that does not fit is refused with :class:`Overloaded` instead of
growing the queue. One background task (started and stopped in the app's lifespan) forms
batches and runs them, one at a time, in a single inference thread. A batch closes when it
reaches ``max_batch_size`` items or at its deadline (``max_wait_s`` after its oldest item); it
runs in length-sorted inference calls of at most ``max_batch_tokens`` padded tokens each (rows
x longest, each window of a long utterance a row), cut by the one batching rule
(:func:`dialogue_safety.core.batch_budget.token_budget_batches`), so the runtime runs each call as it is.

Admission is bounded by time, not only by items: with ``max_queue_wait_s`` set, the batcher
keeps a running estimate of its throughput (seconds per token, from the batches it ran) and
refuses a submission at once (:class:`Overloaded`, 429) when the tokens already queued would
take longer than that to clear. The promise to an accepted item is an answer within
``max_queue_wait_s`` plus one batch (:attr:`MicroBatcher.latency_bound_s`; one batch: the running
mean time of the batches at least half full). When a batch forms, an item that could no longer
get its answer in time is failed with :class:`Overloaded` instead of being served late: one that
waited longer than ``max_queue_wait_s``, or whose wait plus this batch's predicted time (its
padded tokens at the measured speed, times the worst ratio of actual to predicted time over the
recent batches at least half full, within ``SLOWNESS_WINDOW_S`` and at most ``MAX_SLOWNESS``,
plus the event loop's lag in taking results back) would pass the bound. On a core shared with a
busy event loop a batch of the same tokens takes up to ~2.5x longer than on an idle one, so the
prediction errs by tens of percent and the margin must be measured, not assumed. Items that
waited less than half of ``max_queue_wait_s`` are always run (progress before promise: if the
machine turns very slow, fresh items are still served), and a submission of more items than one
batch is not held to the bound for the time its own first batches take.
``queue_size`` stays a hard cap in items.

Encoding (normalisation and tokenisation) always runs in a helper thread, never on the event
loop: a large valid request must not stall ``/health`` or other clients.

The single-request path stays lean: the batcher only waits for company when the last batch
showed concurrent traffic (it held several items, or items arrived while it ran); a lone
request is run at once. Under load the next batch fills while the current one runs, so
waiting rarely matters.

Every future is resolved or failed: results go to their callers in order; items whose caller
went away (cancelled future) are dropped before inference; a failing batch fails only its own
items (:class:`InferenceFailed`) and the loop keeps serving; stopping fails what is left with
:class:`NotReady` (``shutting_down``). :meth:`MicroBatcher.drain` (the hot swap retiring the old
model) refuses new work but lets everything already admitted finish first, including
submissions still being encoded.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from dialogue_safety.core.batch_budget import MAX_BATCH_TOKENS, token_budget_batches
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import NotReady
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.service.errors import InferenceFailed, Overloaded

log = logging.getLogger("dialogue_safety.service.batcher")
RECENT_BATCHES = 32  # batches whose slowness and loop lag bound the next prediction (~5 s under load)
SLOWNESS_WINDOW_S = 10.0  # a batch's slowness counts this long (then light traffic forgets one stall)
MAX_SLOWNESS = 3.0  # the slowness factor at most (a stall must not make every estimate absurd)

EncodeFn = Callable[[Sequence[Example]], list[EncodedExample]]
PredictFn = Callable[[list[EncodedExample]], list[Prediction]]


class BatchObserver(Protocol):
    """What the batcher reports (implemented by :class:`dialogue_safety.service.telemetry.ServiceMetrics`)."""

    def observe_queue_depth(self, depth: int) -> None: ...
    def observe_queue_wait(self, seconds: float) -> None: ...
    def observe_tokenization(self, seconds: float) -> None: ...
    def observe_batch(self, size: int, padded_tokens: int, seconds: float) -> None: ...
    def observe_dropped(self, n: int) -> None: ...
    def observe_batch_failure(self) -> None: ...
    def observe_shed(self, n: int) -> None: ...
    def observe_latency_bound(self, seconds: float) -> None: ...


class NullObserver:
    def observe_queue_depth(self, depth: int) -> None:
        pass

    def observe_queue_wait(self, seconds: float) -> None:
        pass

    def observe_tokenization(self, seconds: float) -> None:
        pass

    def observe_batch(self, size: int, padded_tokens: int, seconds: float) -> None:
        pass

    def observe_dropped(self, n: int) -> None:
        pass

    def observe_batch_failure(self) -> None:
        pass

    def observe_shed(self, n: int) -> None:
        pass

    def observe_latency_bound(self, seconds: float) -> None:
        pass


@dataclass(slots=True)
class _Pending:
    encoded: EncodedExample
    future: asyncio.Future[Prediction]
    enqueued: float  # loop.time() when the submission arrived (before encoding)
    own_wait: float = 0.0  # predicted time of its own submission's batches ahead of it (not waiting for others)


@dataclass(slots=True)
class _Batch:
    max_items: int
    items: list[_Pending] = field(default_factory=list)

    def fits(self, item: _Pending) -> bool:
        return len(self.items) < self.max_items

    def add(self, item: _Pending) -> None:
        self.items.append(item)

    @property
    def full(self) -> bool:
        return len(self.items) >= self.max_items


class Announcement:
    """A request admitted from its head alone (:meth:`MicroBatcher.announce`), before its body is
    read: counted in the wait estimate, as one item, until its items are queued or it ends
    (:meth:`settle`, idempotent), so that the heads of many requests arriving at once are not all
    admitted against the same queue. ``since``: when its head arrived (the wait bound counts from
    there)."""

    __slots__ = ("_batcher", "since")

    def __init__(self, batcher: MicroBatcher, since: float) -> None:
        self._batcher: MicroBatcher | None = batcher
        self.since = since

    def settle(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher._announced -= 1


class MicroBatcher:
    """Merge concurrent submissions into batches for ``predict`` (see the module docstring).

    ``encode`` turns examples into model inputs (called on submit, inline for small submissions,
    in a helper thread for large ones); ``predict`` runs one batch of encoded items and returns
    one prediction per item in order (``OnnxClassifier.predict_encoded``).
    """

    def __init__(
        self,
        encode: EncodeFn,
        predict: PredictFn,
        *,
        max_batch_size: int = 64,
        max_batch_tokens: int = MAX_BATCH_TOKENS,
        max_wait_s: float = 0.002,
        queue_size: int = 1024,
        observer: BatchObserver | None = None,
        retry_after_s: int = 1,
        inline_encode_items: int = 0,
        max_queue_wait_s: float | None = None,
    ) -> None:
        if max_batch_size < 1 or max_batch_tokens < 1 or queue_size < 1 or max_wait_s < 0:
            raise ValueError("max_batch_size, max_batch_tokens and queue_size must be >= 1, max_wait_s >= 0")
        if max_queue_wait_s is not None and max_queue_wait_s <= 0:
            raise ValueError("max_queue_wait_s must be > 0 (or None: bounded by queue_size only)")
        self._encode = encode
        self._predict = predict
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_wait_s = max_wait_s
        self.queue_size = queue_size
        self.retry_after_s = retry_after_s
        self.inline_encode_items = inline_encode_items  # 0: never encode on the event loop
        self.max_queue_wait_s = max_queue_wait_s
        self._seconds_per_token: float | None = None  # EWMA over the batches run so far
        self._queued_tokens = 0  # tokens of the items in the queue (and the carried one)
        self._encoding = 0  # items admitted and being (or waiting to be) encoded
        self._announced = 0  # requests admitted from their head, not queued yet (Announcement)
        self._item_tokens = 64.0  # running mean of tokens per item (to estimate items not encoded yet)
        self._encode_seconds_per_item = 0.0  # running mean of encoding time per item
        self._to_encode: list[tuple[Sequence[Example], asyncio.Future[list[EncodedExample]]]] = []
        self._encoder_busy = False
        self._encoder_task: asyncio.Task[None] | None = None
        self._observer: BatchObserver = observer or NullObserver()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._carry: _Pending | None = None  # taken from the queue, did not fit the last batch
        self._task: asyncio.Task[None] | None = None
        self._infer_pool: ThreadPoolExecutor | None = None
        self._encode_pool: ThreadPoolExecutor | None = None
        self._accepting = False
        self._stopped = False
        self._running_batch = False
        self._running_since = 0.0  # perf_counter() when the running batch started
        self._running_tokens = 0  # padded tokens of the running batch
        self._last_batch_s = 0.0  # how long the last batch took
        self._batch_s: float | None = None  # running mean time of the batches at least half full: "one batch"
        # (perf_counter, actual / predicted time) of the recent batches at least half full
        self._slowness: deque[tuple[float, float]] = deque(maxlen=RECENT_BATCHES)
        self._loop_lag: deque[float] = deque(maxlen=RECENT_BATCHES)  # inference end -> the loop takes the results
        self._arrived_while_running = 0
        self._expect_company = False
        self._outstanding = 0  # futures handed out and not yet settled (drain waits for 0)
        self._settled: asyncio.Event | None = None  # set whenever outstanding or encoding work ends
        self._draining = False

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the batcher is already running")
        self._queue = asyncio.Queue(maxsize=self.queue_size)
        self._settled = asyncio.Event()
        self._settled.set()
        self._infer_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="safety-inference")
        self._encode_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="safety-encode")
        self._task = asyncio.create_task(self._loop(), name="safety-micro-batcher")
        self._task.add_done_callback(self._loop_ended)
        self._accepting = True

    async def stop(self) -> None:
        """Refuse new work, stop the loop, fail every pending future with ``shutting_down``."""
        self._accepting = False
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        pending: list[_Pending] = [self._carry] if self._carry else []
        self._carry = None
        while self._queue is not None and not self._queue.empty():
            pending.append(self._queue.get_nowait())
        for item in pending:
            _fail(item.future, _shutting_down(self.retry_after_s))
        self._queued_tokens = 0
        self._observer.observe_queue_depth(0)
        self._fail_unencoded(())  # not handed to the encoding thread yet
        for pool in (self._infer_pool, self._encode_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._infer_pool = self._encode_pool = None

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work, let every admitted item finish (those still being encoded, the queued
        ones and the running batch), then :meth:`stop` (what is still pending after ``timeout_s``
        fails with ``shutting_down``). True when everything finished in time. The hot swap retires
        the old model's batcher with it."""
        self._accepting = False
        self._draining = True
        drained = True
        try:
            async with asyncio.timeout(timeout_s):
                while self._settled is not None and (self._outstanding or self._encoding):
                    self._settled.clear()
                    await self._settled.wait()
        except TimeoutError:
            drained = False
        await self.stop()
        return drained

    def _settle(self, future: asyncio.Future[Prediction] | None = None) -> None:
        if future is not None:  # a handed-out future settled (None: an encoding ended)
            self._outstanding -= 1
        if self._settled is not None:
            self._settled.set()  # drain() re-checks what is left

    @property
    def running(self) -> bool:
        return self._accepting and self._task is not None and not self._task.done()

    @property
    def depth(self) -> int:
        """Items waiting for a batch (not counting the batch being run)."""
        queued = self._queue.qsize() if self._queue is not None else 0
        return queued + (1 if self._carry is not None else 0)

    @property
    def expected_wait_s(self) -> float | None:
        """How long a new item would wait for its batch to start: what is left of the running batch,
        then the queued work and the admitted items still being encoded, at the measured throughput
        (None: not measured yet)."""
        spt = self._seconds_per_token
        if spt is None:
            return None
        running = 0.0
        if self._running_batch:
            running = max(0.0, self._running_tokens * spt - (time.perf_counter() - self._running_since))
        to_encode = self._encoding + self._announced
        encoding = to_encode * self._encode_seconds_per_item  # one encoding thread: they wait in turn
        return running + encoding + (self._queued_tokens + to_encode * self._item_tokens) * spt

    @property
    def latency_bound_s(self) -> float | None:
        """The answer time promised to an accepted item: ``max_queue_wait_s`` plus one batch (the
        running mean time of the batches at least half full); None without ``max_queue_wait_s`` or
        before such a batch ran."""
        if self.max_queue_wait_s is None or self._batch_s is None:
            return None
        return self.max_queue_wait_s + self._batch_s

    def wait_limit_s(self, batch_s: float | None, slowness: float | None = None) -> float | None:
        """How long an item may wait and still be answered within :attr:`latency_bound_s` by a batch
        predicted to take ``batch_s`` once it starts (None: no limit): the bound less that time times
        the worst slowness of the recent batches (actual / predicted time; ``slowness`` when the
        caller has it already) and the event loop's lag; at most ``max_queue_wait_s``, at least half
        of it (so that fresh items always run)."""
        limit = self.max_queue_wait_s
        bound = self.latency_bound_s
        if limit is None or bound is None or batch_s is None:
            return limit
        slowness = self._slowness_factor() if slowness is None else slowness
        finish = batch_s * slowness + max(self._loop_lag, default=0.0)
        return max(limit / 2, min(limit, bound - finish))

    def _slowness_factor(self) -> float:
        """The worst ratio of actual to predicted batch time over the recent batches at least half full
        (the last ``RECENT_BATCHES`` within ``SLOWNESS_WINDOW_S``), between 1 and ``MAX_SLOWNESS``."""
        since = time.perf_counter() - SLOWNESS_WINDOW_S
        worst = max((ratio for at, ratio in self._slowness if at >= since), default=1.0)
        return min(MAX_SLOWNESS, max(1.0, worst))

    def refusal(self, n: int = 1) -> Overloaded | None:
        """The :class:`Overloaded` a submission of ``n`` items would get now (None: it would be admitted
        so far). Cheap, for refusing before a request's body is even read."""
        if not self._accepting or self._queue is None:
            return None  # not ready or stopping: the handler answers that
        return self._overload(n)

    def live_depth(self) -> int:
        """Items waiting whose caller still waits (cancelled ones are dropped when reached)."""
        waiting = list(self._queue._queue) if self._queue is not None else []  # type: ignore[attr-defined]
        if self._carry is not None:
            waiting.append(self._carry)
        return sum(1 for item in waiting if not item.future.done())

    def announce(self) -> Announcement | Overloaded | None:
        """Admit a request from its head alone, before its body is read: the :class:`Overloaded` it
        gets if even one item would be refused now, else an :class:`Announcement` to pass to
        :meth:`enqueue` (None: not accepting; the handler answers that)."""
        refusal = self.refusal(1)
        if refusal is not None or not self._accepting:
            return refusal
        self._announced += 1
        return Announcement(self, asyncio.get_running_loop().time())

    # -- submitting -----------------------------------------------------------------------------
    async def submit(self, examples: Sequence[Example]) -> list[Prediction]:
        """Predict ``examples`` (in order) as part of whatever batches form; raises
        :class:`Overloaded` when the queue cannot take them all, :class:`NotReady` when stopped,
        :class:`InferenceFailed` when a batch holding one of them failed. Cancelling the caller
        drops its items that have not reached inference yet."""
        futures = await self.enqueue(examples)
        if len(futures) == 1:
            return [await futures[0]]  # cancelling the caller cancels the future: dropped
        try:
            return list(await asyncio.gather(*futures))
        finally:
            self.release(futures)

    async def enqueue(
        self, examples: Sequence[Example], announcement: Announcement | None = None
    ) -> list[asyncio.Future[Prediction]]:
        """Encode ``examples`` and queue them together; one future per example, in order.
        ``announcement``: the request was admitted from its head (:meth:`announce`); its wait counts
        from then, and it stops being counted as announced.

        Callers that stop waiting must :meth:`release` the futures (cancel what is pending)."""
        loop = asyncio.get_running_loop()
        arrived = loop.time()  # the wait bound counts from here: waiting to be encoded is waiting too
        if announcement is not None:
            announcement.settle()
            arrived = min(arrived, announcement.since)
        n = len(examples)
        if n == 0:
            return []
        self._check_room(n)  # before encoding: refusing must stay cheap under overload
        start = time.perf_counter()
        self._encoding += n
        try:
            if n <= self.inline_encode_items:
                encoded = self._timed_encode(examples)
            else:
                encoded = await self._encode_off_loop(examples)
        finally:
            self._encoding -= n
            self._settle()  # no await before _enqueue: a draining batcher sees these items queued
        self._observer.observe_tokenization(time.perf_counter() - start)
        if len(encoded) != n:
            raise RuntimeError(f"encode returned {len(encoded)} items for {n} examples")
        return self._enqueue(encoded, arrived)

    def _timed_encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """``encode``, keeping a running mean of its time per item (for the wait estimate)."""
        start = time.perf_counter()
        encoded = self._encode(examples)
        if examples:
            per_item = (time.perf_counter() - start) / len(examples)
            self._encode_seconds_per_item = 0.9 * self._encode_seconds_per_item + 0.1 * per_item
        return encoded

    async def _encode_off_loop(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """Encode in the encoding thread, together with whatever other submissions are waiting:
        one call per round instead of one per request (under load, each thread hand-off costs a
        GIL switch interval while the event loop is busy)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[EncodedExample]] = loop.create_future()
        self._to_encode.append((examples, future))
        if not self._encoder_busy:
            self._encoder_busy = True
            self._encoder_task = loop.create_task(self._encode_rounds())
        return await future

    async def _encode_rounds(self) -> None:
        loop = asyncio.get_running_loop()
        jobs: list[tuple[Sequence[Example], asyncio.Future[list[EncodedExample]]]] = []
        try:
            while self._to_encode:
                jobs, self._to_encode = self._to_encode, []
                jobs = [(examples, future) for examples, future in jobs if not future.done()]  # callers gone
                if not jobs:
                    continue
                flat = [example for examples, _ in jobs for example in examples]
                try:
                    encoded = await loop.run_in_executor(self._encode_pool, self._timed_encode, flat)
                except Exception:
                    if len(jobs) == 1:
                        _fail_encoding(jobs[0][1], sys.exc_info()[1])
                        continue
                    for examples, future in jobs:  # isolate the submission that fails
                        try:
                            one = await loop.run_in_executor(self._encode_pool, self._timed_encode, examples)
                        except Exception as exc:
                            _fail_encoding(future, exc)
                        else:
                            if not future.done():
                                future.set_result(one)
                    continue
                start = 0
                for examples, future in jobs:
                    if not future.done():
                        future.set_result(encoded[start : start + len(examples)])
                    start += len(examples)
        except BaseException:  # stopped: the pool dropped its queued work; no submission may wait forever
            self._fail_unencoded(jobs)
            raise
        finally:
            self._encoder_busy = False

    def _fail_unencoded(self, jobs: Sequence[tuple[Sequence[Example], asyncio.Future[list[EncodedExample]]]]) -> None:
        """Fail the submissions of ``jobs`` and those still waiting for the encoding thread."""
        waiting, self._to_encode = self._to_encode, []
        for _, future in [*jobs, *waiting]:
            _fail_encoding(future, _shutting_down(self.retry_after_s))

    def release(self, futures: Sequence[asyncio.Future[Prediction]]) -> None:
        """Cancel the futures still pending (they are dropped before inference) and mark the
        failures of the others as retrieved (no 'exception was never retrieved' warnings)."""
        cancelled = 0
        for fut in futures:
            if not fut.done():
                fut.cancel()
                cancelled += 1
            elif not fut.cancelled():
                fut.exception()
        if cancelled:
            self._observer.observe_queue_depth(self.live_depth())

    def _check_room(self, n: int, *, wait: bool = True) -> None:
        # wait=False: items admitted before encoding; a draining batcher still takes them (in flight)
        admitted_while_draining = not wait and self._draining and self._task is not None and not self._task.done()
        if not (self._accepting or admitted_while_draining) or self._queue is None:
            raise _shutting_down(self.retry_after_s) if self._stopped else NotReady("the batcher is not running")
        overload = self._overload(n, wait=wait)
        if overload is not None:
            raise overload

    def _overload(self, n: int, *, wait: bool = True) -> Overloaded | None:
        """The refusal ``n`` more items get now, if any (returned, not raised: refusing stays cheap and
        leaves no traceback cycles for the garbage collector)."""
        if self.queue_size - self.depth - self._encoding < n:
            return Overloaded(
                f"the inference queue is full ({self.depth}/{self.queue_size} items waiting); retry later",
                retry_after_s=self.retry_after_s,
            )
        if not wait or self.max_queue_wait_s is None:
            return None
        expected = self.expected_wait_s
        if expected is None:
            return None
        # The limit its batch will apply (for a typical batch), less headroom for the estimate's error:
        # refused now, fast, rather than after waiting. The headroom is one batch, at most half the
        # limit, so that an idle batcher always admits (one very long batch must not refuse the next
        # requests for ever).
        slowness = self._slowness_factor()
        limit = self.wait_limit_s(self._batch_s, slowness)
        assert limit is not None
        headroom = min(self._batch_s if self._batch_s is not None else self._last_batch_s, limit / 2)
        expected *= slowness  # the queued work is predicted like a batch: as slow as lately
        if expected + headroom > limit:
            return Overloaded(
                f"an item admitted now would wait about {expected * 1000:.0f} ms for inference; with one batch of "
                f"headroom that is more than the {limit * 1000:.0f} ms it may wait to be answered within "
                f"SAFETY_MAX_QUEUE_WAIT_MS ({self.max_queue_wait_s * 1000:.0f} ms) plus one batch; retry later",
                retry_after_s=self.retry_after_s,
            )
        return None

    def _enqueue(self, encoded: list[EncodedExample], arrived: float) -> list[asyncio.Future[Prediction]]:
        # Again (encoding may have awaited), for the hard cap only: the work of encoding is done,
        # and an item that then waits too long is refused when its batch forms.
        self._check_room(len(encoded), wait=False)
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Prediction]] = []
        own_waits = self._own_waits(encoded)
        for enc, own_wait in zip(encoded, own_waits, strict=True):  # no await in between: items stay together
            fut: asyncio.Future[Prediction] = loop.create_future()
            self._queue.put_nowait(_Pending(enc, fut, arrived, own_wait))
            self._queued_tokens += enc.tokens
            self._item_tokens = 0.9 * self._item_tokens + 0.1 * enc.tokens
            fut.add_done_callback(self._settle)
            futures.append(fut)
        self._outstanding += len(encoded)
        if self._running_batch:
            self._arrived_while_running += len(encoded)
        self._observer.observe_queue_depth(self.depth)
        return futures

    def _own_waits(self, encoded: list[EncodedExample]) -> list[float]:
        """For each item of one submission, the predicted time of the submission's own batches ahead of
        it (a request of more items than one batch waits for its own first batches: that is not
        waiting for others, so the wait limit does not count it)."""
        size, spt = self.max_batch_size, self._seconds_per_token
        if len(encoded) <= size or spt is None:
            return [0.0] * len(encoded)
        waits, ahead, slowness = [], 0.0, self._slowness_factor()
        for start in range(0, len(encoded), size):
            chunk = encoded[start : start + size]
            waits += [ahead] * len(chunk)
            ahead += self._padded_tokens(chunk) * spt * slowness
        return waits

    # -- the loop ---------------------------------------------------------------------------------
    async def _loop(self) -> None:
        assert self._queue is not None
        while True:
            batch = await self._next_batch()
            try:
                await self._run(batch)
            except asyncio.CancelledError:
                for item in batch.items:
                    _fail(item.future, _shutting_down(self.retry_after_s))
                raise
            except Exception:  # a bug here must not stop the service: fail this batch only
                log.exception("micro-batcher: unexpected error; failing one batch and continuing")
                for item in batch.items:
                    _fail(item.future, InferenceFailed())

    async def _next_batch(self) -> _Batch:
        assert self._queue is not None
        batch = _Batch(self.max_batch_size)
        while not batch.items:  # skip items whose caller is gone
            if self._carry is not None:
                first, self._carry = self._carry, None
            else:
                first = await self._queue.get()
            self._queued_tokens -= first.encoded.tokens
            self._take(batch, first)
        if self._drain(batch) or not self._expect_company or self.max_wait_s <= 0:
            return batch
        deadline = batch.items[0].enqueued + self.max_wait_s
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    item = await self._queue.get()  # cancellation-safe: no item is lost
                    self._queued_tokens -= item.encoded.tokens
                    if not self._offer(batch, item) or batch.full:
                        break
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # stopped while waiting for company: fail what was taken
            for taken in batch.items:
                _fail(taken.future, _shutting_down(self.retry_after_s))
            raise
        return batch

    def _drain(self, batch: _Batch) -> bool:
        """Take what is already queued; True once the batch is closed (full)."""
        assert self._queue is not None
        while not batch.full:
            if self._queue.empty():
                return False
            item = self._queue.get_nowait()
            self._queued_tokens -= item.encoded.tokens
            if not self._offer(batch, item):
                return True
        return True

    def _offer(self, batch: _Batch, item: _Pending) -> bool:
        """Add ``item`` if it fits; otherwise keep it for the next batch and return False."""
        if item.future.done():
            self._observer.observe_dropped(1)
            return True
        if not batch.fits(item):
            self._carry = item
            self._queued_tokens += item.encoded.tokens  # still waiting
            return False
        batch.add(item)
        return True

    def _take(self, batch: _Batch, item: _Pending) -> None:
        if item.future.done():
            self._observer.observe_dropped(1)
        else:
            batch.add(item)

    async def _run(self, batch: _Batch) -> None:
        live = [item for item in batch.items if not item.future.done()]  # cancelled while waiting
        if len(live) < len(batch.items):
            self._observer.observe_dropped(len(batch.items) - len(live))
        loop = asyncio.get_running_loop()
        now = loop.time()
        encoded = [item.encoded for item in live]
        calls = self._calls(encoded)
        padded = _padded(encoded, calls)
        spt = self._seconds_per_token
        predicted = padded * spt if spt is not None else None
        if live and self.max_queue_wait_s is not None:  # never serve late: refuse what cannot be answered in time
            limit = self.wait_limit_s(predicted)
            assert limit is not None
            late = [item for item in live if now - item.enqueued - item.own_wait > limit]
            if late:
                live = [item for item in live if now - item.enqueued - item.own_wait <= limit]
                encoded = [item.encoded for item in live]
                calls = self._calls(encoded)
                padded = _padded(encoded, calls)
                predicted = padded * spt if spt is not None else None
                self._observer.observe_shed(len(late))
                for item in late:
                    _fail(
                        item.future,
                        Overloaded(
                            f"this request waited {(now - item.enqueued) * 1000:.0f} ms for inference: too long to be "
                            f"answered within SAFETY_MAX_QUEUE_WAIT_MS ({self.max_queue_wait_s * 1000:.0f} ms) plus "
                            "one batch; retry later",
                            retry_after_s=self.retry_after_s,
                        ),
                    )
        batch.items = live
        self._observer.observe_queue_depth(self.live_depth())
        if not live:
            return
        for item in live:
            self._observer.observe_queue_wait(now - item.enqueued)
        self._running_batch, self._arrived_while_running = True, 0
        start = time.perf_counter()
        self._running_since, self._running_tokens = start, padded
        try:
            predictions, timings, ended = await loop.run_in_executor(
                self._infer_pool, self._predict_calls, encoded, calls
            )
        except Exception:
            # Log the failure without the inputs; fail only this batch's callers.
            log.exception("inference failed for a batch of %d items (%d padded tokens)", len(live), padded)
            self._observer.observe_batch_failure()
            for item in live:
                _fail(item.future, InferenceFailed())
            return
        finally:
            self._running_batch = False
            self._expect_company = len(live) > 1 or self._arrived_while_running > 0
        resumed = time.perf_counter()
        self._loop_lag.append(max(0.0, resumed - ended))
        elapsed = ended - start
        self._last_batch_s = elapsed
        self._learn_speed(len(live), padded, elapsed, predicted)
        for size, tokens, seconds in timings:
            self._observer.observe_batch(size, tokens, seconds)
        for item, prediction in zip(live, predictions, strict=True):
            if not item.future.done():
                item.future.set_result(prediction)

    def _learn_speed(self, items: int, padded: int, elapsed: float, predicted: float | None) -> None:
        """Update the throughput estimate, one batch's time and the slowness after a batch ran."""
        fullness = min(1.0, items / self.max_batch_size)
        per_token = elapsed / max(1, padded)
        old = self._seconds_per_token
        # Weighted by how full the batch was: the estimate is for a long queue, which runs in full
        # batches; a lone request costs ~3x more per token and must not make the next burst look slow.
        weight = 0.2 * fullness
        self._seconds_per_token = per_token if old is None else (1 - weight) * old + weight * per_token
        if fullness < 0.5:  # small batches: mostly fixed cost, neither "one batch" nor a fair test of the estimate
            return
        self._batch_s = elapsed if self._batch_s is None else 0.8 * self._batch_s + 0.2 * elapsed
        if self.latency_bound_s is not None and self._accepting:  # not a batcher draining after a hot swap
            self._observer.observe_latency_bound(self.latency_bound_s)
        if predicted:
            self._slowness.append((time.perf_counter(), elapsed / predicted))

    def _calls(self, encoded: Sequence[EncodedExample]) -> list[list[int]]:
        widths = [e.width for e in encoded]
        rows = [len(e.rows) for e in encoded]  # the windows of a long utterance count
        return [list(idx) for idx in token_budget_batches(widths, self.max_batch_tokens, self.max_batch_size, rows)]

    def _padded_tokens(self, encoded: Sequence[EncodedExample]) -> int:
        return _padded(encoded, self._calls(encoded))

    def _predict_calls(
        self, encoded: list[EncodedExample], calls: Sequence[Iterable[int]]
    ) -> tuple[list[Prediction], list[tuple[int, int, float]], float]:
        """Run the inference calls of one batch (in the inference thread): predictions in the
        batch's order, (items, padded tokens, seconds) of each call, and when the last call ended
        (``perf_counter``)."""
        predictions: list[Prediction | None] = [None] * len(encoded)
        timings: list[tuple[int, int, float]] = []
        for call in calls:
            start = time.perf_counter()
            idx = list(call)
            run = [encoded[i] for i in idx]
            got = self._predict(run)
            if len(got) != len(run):
                raise RuntimeError(f"predict returned {len(got)} predictions for {len(run)} items")
            for i, prediction in zip(idx, got, strict=True):
                predictions[i] = prediction
            timings.append((len(run), _padded(run, [range(len(run))]), time.perf_counter() - start))
        return [p for p in predictions if p is not None], timings, time.perf_counter()

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("micro-batcher loop stopped", exc_info=task.exception())
            self._accepting = False


def _padded(encoded: Sequence[EncodedExample], calls: Sequence[Sequence[int]]) -> int:
    """Padded tokens of a batch run in ``calls`` (rows x longest, per call: every window of a long
    utterance is a row), with the second, short pass over the utterances alone of a decomposed
    model (``EncodedExample.alone``)."""
    total = 0
    for idx in calls:
        total += sum(len(encoded[i].rows) for i in idx) * max(encoded[i].width for i in idx)
        alone = [a for i in idx if (a := encoded[i].alone) is not None]
        total += sum(len(a.rows) for a in alone) * max((a.width for a in alone), default=0)
    return total


def _shutting_down(retry_after_s: int) -> NotReady:
    return NotReady(
        "the service is shutting down; retry on another instance", code="shutting_down", retry_after_s=retry_after_s
    )


def _fail_encoding(future: asyncio.Future[list[EncodedExample]], exc: BaseException | None) -> None:
    if not future.done():
        future.set_exception(exc if exc is not None else RuntimeError("encoding failed"))


def _fail(future: asyncio.Future[Prediction], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
