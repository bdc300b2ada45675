"""Micro-batching: concurrent requests merged into inference batches, off the event loop.

An ``asyncio.Queue`` of pending items (an encoded example and the future its caller awaits),
bounded: a submission that does not fit is refused with :class:`Overloaded` instead of growing
the queue. One background task (started and stopped in the app's lifespan) forms batches and
runs them, one at a time, in a single inference thread. A batch closes when it reaches
``max_batch_size`` items or at its deadline (``max_wait_s`` after its oldest item); it runs in
length-sorted inference calls of at most ``max_batch_tokens`` padded tokens each (rows x longest,
each window of a long utterance a row), cut by the one batching rule
(:func:`dialogue_safety.core.batch_budget.token_budget_batches`). The settings
(:class:`dialogue_safety.service.settings.ServiceSettings`) hold every default.

Admission is bounded by time as well as by ``queue_size`` items: with ``max_queue_wait_s``, a
submission whose wait would be too long is refused at once and an item that could no longer be
answered in time is refused when its batch forms (the rules and the estimates they use:
:mod:`dialogue_safety.service.latency`). Encoding runs in a helper thread, coalesced
(:mod:`dialogue_safety.service.encoder`), except, when the service asks for it, a lone short request to
an idle batcher, encoded on the loop (``LONE_INLINE_CHARS``): one thread round trip fewer.

The single-request path stays lean: the batcher only waits for company when the last batch showed
concurrent traffic (it held several items, or items arrived while it ran). Every future is
resolved or failed: items whose caller went away are dropped before inference; a failing batch
fails only its own items (:class:`InferenceFailed`); stopping fails what is left with
:class:`NotReady` (``shutting_down``). :meth:`MicroBatcher.drain` (the hot swap retiring the old
model) refuses new work but lets everything already admitted finish first.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from typing import Any

from dialogue_safety.core.batch_budget import token_budget_batches
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import NotReady
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.service.batch_observer import BatchObserver, NullObserver
from dialogue_safety.service.batch_queue import BatchQueue, Pending
from dialogue_safety.service.encoder import EncodeCoalescer, EncodeFn
from dialogue_safety.service.errors import InferenceFailed, Overloaded
from dialogue_safety.service.latency import LatencyEstimator
from dialogue_safety.service.settings import ServiceSettings

log = logging.getLogger("dialogue_safety.service.batcher")
# A lone request this short (utterance and history, in characters) to an idle batcher is encoded on the
# event loop when the service asks for it (``inline_lone_chars``): ~0.5 ms of tokenisation at most on a
# 2-core EPYC (0.23 ms per 1,000 utterance characters; the history is truncated first), less than the
# round trip through the encoding thread costs a request that would otherwise wait for nothing.
LONE_INLINE_CHARS = 2_000
PredictFn = Callable[[list[EncodedExample]], list[Prediction]]


class Announcement:
    """A request admitted from its head alone (:meth:`MicroBatcher.announce`), before its body is read:
    counted in the wait estimate, as one item, until its items are queued or it ends (:meth:`settle`,
    idempotent), so that the heads of many requests arriving at once are not all admitted against the
    same queue. ``since``: when its head arrived (the wait bound counts from there)."""

    __slots__ = ("_batcher", "since")

    def __init__(self, batcher: MicroBatcher, since: float) -> None:
        self._batcher: MicroBatcher | None = batcher
        self.since = since

    def settle(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher._announced -= 1


class MicroBatcher:
    """Merge submissions into batches for ``predict`` (one inference call: one prediction per item, in
    order). ``settings``: batch size and tokens, wait for company, queue size, Retry-After;
    ``max_queue_wait_s``: the time bound in force (None: ``queue_size`` only); ``follow_machine``: it was derived
    from the machine at warm-up and follows the speed batches run at (never under the warm-up's value)."""

    def __init__(
        self,
        encode: EncodeFn,
        predict: PredictFn,
        settings: ServiceSettings,
        *,
        max_queue_wait_s: float | None = None,
        observer: BatchObserver | None = None,
        inline_encode_items: int = 0,
        inline_lone_chars: int = 0,
        follow_machine: bool = False,
    ) -> None:
        if max_queue_wait_s is not None and max_queue_wait_s <= 0:
            raise ValueError("max_queue_wait_s must be > 0 (or None: bounded by queue_size only)")
        self._predict = predict
        self.max_batch_size = settings.max_batch_size
        self.max_batch_tokens = settings.max_batch_tokens
        self.max_wait_s = settings.max_wait_s
        self.queue_size = settings.queue_size
        self.retry_after_s = settings.retry_after_s
        self.inline_encode_items = inline_encode_items  # submissions this small are encoded on the loop (0: never)
        self.inline_lone_chars = inline_lone_chars  # ... and a lone request this short to an idle batcher (0: never)
        self.estimator = LatencyEstimator(self.max_batch_size, max_queue_wait_s, follow_machine=follow_machine)
        self._encoder = EncodeCoalescer(encode, self.estimator.learn_encoding, self._shutting_down)
        self._observer: BatchObserver = observer or NullObserver()
        self._queue: BatchQueue | None = None
        self._task: asyncio.Task[None] | None = None
        self._inference = _InferenceThread()
        self._encoding = 0  # items admitted and being (or waiting to be) encoded
        self._announced = 0  # requests admitted from their head, not queued yet (Announcement)
        self._accepting = self._stopped = self._draining = False
        self._running_batch = False
        self._arrived_while_running = 0
        self._expect_company = False
        self._outstanding = 0  # futures handed out and not yet settled (drain waits for 0)
        self._settled: asyncio.Event | None = None  # set whenever outstanding or encoding work ends

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the batcher is already running")
        self._queue = BatchQueue(self.queue_size, self._observer.observe_dropped)
        self._settled = asyncio.Event()
        self._settled.set()
        self._inference.start()
        self._encoder.start()
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
        if self._queue is not None:
            _fail_all(self._queue.take_all(), self._shutting_down())
        self._observer.observe_queue_depth(0)
        self._encoder.stop()  # what was not handed to the encoding thread yet fails too
        self._inference.stop()

    async def drain(self, timeout_s: float) -> bool:
        """Let every admitted item finish, refusing new work, then :meth:`stop`; True if all did in time."""
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
    def max_queue_wait_s(self) -> float | None:
        """The queue-wait bound in force (a bound derived from the machine follows it: ``follow_machine``,
        :class:`dialogue_safety.service.latency.LatencyEstimator`)."""
        return self.estimator.max_queue_wait_s

    @property
    def depth(self) -> int:
        """Items waiting for a batch (not counting the batch being run)."""
        return len(self._queue) if self._queue is not None else 0

    def live_depth(self) -> int:
        """Items waiting whose caller still waits (cancelled ones are dropped when reached)."""
        return self._queue.live() if self._queue is not None else 0

    @property
    def expected_wait_s(self) -> float | None:
        """How long a new item would wait for its batch to start (None: not measured yet)."""
        queued = self._queue.tokens if self._queue is not None else 0
        return self.estimator.expected_wait_s(queued, self._encoding + self._announced)

    # -- admitting ------------------------------------------------------------------------------
    def refusal(self, n: int = 1) -> Overloaded | None:
        """The :class:`Overloaded` ``n`` items would get now, cheap, for refusing before a body is read."""
        return self._overload(n) if self._accepting and self._queue is not None else None

    def announce(self) -> Announcement | Overloaded | None:
        """Admit a request from its head alone: an :class:`Announcement` for :meth:`enqueue`, or a refusal."""
        refusal = self.refusal(1)
        if refusal is not None or not self._accepting:
            return refusal
        self._announced += 1
        return Announcement(self, asyncio.get_running_loop().time())

    def _check_room(self, n: int, *, wait: bool = True) -> None:
        # wait=False: items admitted before encoding; a draining batcher still takes them (in flight)
        admitted_while_draining = not wait and self._draining and self._task is not None and not self._task.done()
        if not (self._accepting or admitted_while_draining) or self._queue is None:
            raise self._shutting_down() if self._stopped else NotReady("the batcher is not running")
        overload = self._overload(n, wait=wait)
        if overload is not None:
            raise overload

    def _overload(self, n: int, *, wait: bool = True) -> Overloaded | None:
        """The refusal ``n`` more items get now (returned, not raised: no traceback cycles for the GC)."""
        if self.queue_size - self.depth - self._encoding < n:
            return Overloaded(
                f"the inference queue is full ({self.depth}/{self.queue_size} items waiting); retry later",
                retry_after_s=self.retry_after_s,
            )
        expected = self.expected_wait_s if wait and self.max_queue_wait_s is not None else None
        return None if expected is None else self.estimator.refusal(expected, self.retry_after_s)

    # -- submitting -----------------------------------------------------------------------------
    async def submit(self, examples: Sequence[Example]) -> list[Prediction]:
        """Predict ``examples`` (in order); raises Overloaded, NotReady or InferenceFailed."""
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
        """Encode and queue ``examples`` together: one future each, to :meth:`release` when no longer awaited."""
        arrived = asyncio.get_running_loop().time()  # the wait bound counts from here: encoding is waiting too
        if announcement is not None:
            announcement.settle()
            arrived = min(arrived, announcement.since)
        n = len(examples)
        if n == 0:
            return []
        self._check_room(n)  # before encoding: refusing must stay cheap under overload
        start = time.perf_counter()
        inline = n <= self.inline_encode_items or self._lone_and_short(examples)
        self._encoding += n
        try:
            if inline:
                encoded = self._encoder.encode_inline(examples)
            else:
                encoded = await self._encoder.encode(examples)
        finally:
            self._encoding -= n
            self._settle()  # no await before _enqueue: a draining batcher sees these items queued
        self._observer.observe_tokenization(time.perf_counter() - start)
        if len(encoded) != n:
            raise RuntimeError(f"encode returned {len(encoded)} items for {n} examples")
        return self._enqueue(encoded, arrived)

    def _lone_and_short(self, examples: Sequence[Example]) -> bool:
        """One short example and an idle batcher (no batch running, nothing queued or being encoded):
        encoding it here costs less than the hop to the encoding thread and back, and no other request
        is waiting for the loop meanwhile (``inline_lone_chars``)."""
        if not self.inline_lone_chars or len(examples) != 1 or self._running_batch or self._encoding or self.depth:
            return False
        example = examples[0]
        chars = len(example.utterance) + sum(len(turn.text) for turn in example.history)
        return chars <= self.inline_lone_chars

    def release(self, futures: Sequence[asyncio.Future[Prediction]]) -> None:
        """Cancel the futures still pending; mark the failures of the others as retrieved."""
        cancelled = 0
        for fut in futures:
            if not fut.done():
                fut.cancel()
                cancelled += 1
            elif not fut.cancelled():
                fut.exception()
        if cancelled:
            self._observer.observe_queue_depth(self.live_depth())

    def _enqueue(self, encoded: list[EncodedExample], arrived: float) -> list[asyncio.Future[Prediction]]:
        # the hard cap again (encoding may have awaited); one that then waits too long is refused later
        self._check_room(len(encoded), wait=False)
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Prediction]] = []
        own_waits = [0.0] * len(encoded)
        if len(encoded) > self.max_batch_size:  # it waits for its own first batches: not held against it
            chunks = [encoded[i : i + self.max_batch_size] for i in range(0, len(encoded), self.max_batch_size)]
            own_waits = self.estimator.own_waits([(len(c), self._padded_tokens(c)) for c in chunks])
        for enc, own_wait in zip(encoded, own_waits, strict=True):  # no await in between: items stay together
            fut: asyncio.Future[Prediction] = loop.create_future()
            self._queue.put(Pending(enc, fut, arrived, own_wait))
            self.estimator.learn_item(enc.tokens)
            fut.add_done_callback(self._settle)
            futures.append(fut)
        self._outstanding += len(encoded)
        if self._running_batch:
            self._arrived_while_running += len(encoded)
        self._observer.observe_queue_depth(self.depth)
        return futures

    # -- the loop ---------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            batch = await self._next_batch()
            try:
                await self._run(batch)
            except asyncio.CancelledError:
                self._fail_stopped(batch)
                raise
            except Exception:  # a bug here must not stop the service: fail this batch only
                log.exception("micro-batcher: unexpected error; failing one batch and continuing")
                _fail_all(batch, InferenceFailed())

    async def _next_batch(self) -> list[Pending]:
        assert self._queue is not None
        wait_s = self.max_wait_s if self._expect_company else 0.0  # company only when traffic is concurrent
        return await self._queue.next_batch(self.max_batch_size, wait_s, self._fail_stopped)

    def _shed_late(self, live: list[Pending], now: float) -> list[Pending]:
        """Refuse the items that could no longer be answered within the bound (never served late)."""
        limit = self.estimator.late_after_s(self._padded_tokens([item.encoded for item in live]))
        assert limit is not None
        late = [item for item in live if now - item.enqueued - item.own_wait > limit]
        if late:
            self._observer.observe_shed(len(late))
            for item in late:
                _fail(item.future, self.estimator.too_late(now - item.enqueued, self.retry_after_s))
        return [item for item in live if now - item.enqueued - item.own_wait <= limit]

    async def _run(self, batch: list[Pending]) -> None:
        live = [item for item in batch if not item.future.done()]  # cancelled while waiting
        if len(live) < len(batch):
            self._observer.observe_dropped(len(batch) - len(live))
        loop = asyncio.get_running_loop()
        now = loop.time()
        if live and self.max_queue_wait_s is not None:
            live = self._shed_late(live, now)
        batch[:] = live
        self._observer.observe_queue_depth(self.live_depth())
        if not live:
            return
        encoded = [item.encoded for item in live]
        calls = _calls(encoded, self.max_batch_tokens, self.max_batch_size)
        padded = _padded(encoded, calls)
        predicted = self.estimator.predict_s(padded)
        for item in live:
            self._observer.observe_queue_wait(now - item.enqueued)
        self._running_batch, self._arrived_while_running = True, 0
        start = self.estimator.started(padded)
        try:
            predictions, timings, ended = await self._inference.run(self._predict, encoded, calls)
        except Exception:
            # Log the failure without the inputs; fail only this batch's callers.
            log.exception("inference failed for a batch of %d items (%d padded tokens)", len(live), padded)
            self._observer.observe_batch_failure()
            _fail_all(live, InferenceFailed())
            return
        finally:
            self._running_batch = False
            self.estimator.ended()
            self._expect_company = len(live) > 1 or self._arrived_while_running > 0
        lag = time.perf_counter() - ended
        if self.estimator.learn_batch(len(live), padded, ended - start, predicted, lag) and self._accepting:
            bound = self.estimator.latency_bound_s  # not reported by a batcher draining after a hot swap
            if bound is not None:
                self._observer.observe_latency_bound(bound)
        for size, tokens, seconds in timings:
            self._observer.observe_batch(size, tokens, seconds)
        for item, prediction in zip(live, predictions, strict=True):
            if not item.future.done():
                item.future.set_result(prediction)

    def _padded_tokens(self, encoded: Sequence[EncodedExample]) -> int:
        return _padded(encoded, _calls(encoded, self.max_batch_tokens, self.max_batch_size))

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("micro-batcher loop stopped", exc_info=task.exception())
            self._accepting = False

    def _fail_stopped(self, items: Sequence[Pending]) -> None:
        _fail_all(items, self._shutting_down())

    def _shutting_down(self) -> NotReady:
        return _shutting_down(self.retry_after_s)


# one batch's predictions, (items, padded tokens, seconds) of each call, and when the last call ended
_Result = tuple[list[Prediction], list[tuple[int, int, float]], float]
_Job = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[_Result]", PredictFn, list[EncodedExample], Sequence[Iterable[int]]
]


class _InferenceThread:
    """The one thread inference runs in, off the event loop. A job goes over a queue and its result comes
    back with one ``call_soon_threadsafe`` (no executor future chained to an asyncio one: the lone request's
    path is a hand-off each way and nothing more)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] | None = None
        self._end: weakref.finalize[..., Any] | None = None

    def start(self) -> None:
        jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._jobs = jobs
        threading.Thread(target=_serve_jobs, args=(jobs,), name="safety-inference", daemon=True).start()
        self._end = weakref.finalize(self, jobs.put, None)  # a batcher dropped without stop() ends its thread too

    def stop(self) -> None:
        """The thread ends after the job it runs, if any (whose awaiting caller was cancelled first)."""
        if self._end is not None:
            self._end()  # puts the end of the jobs once
        self._jobs = self._end = None

    async def run(self, predict: PredictFn, encoded: list[EncodedExample], calls: Sequence[Iterable[int]]) -> _Result:
        if self._jobs is None:
            raise RuntimeError("the inference thread is not running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Result] = loop.create_future()
        self._jobs.put((loop, future, predict, encoded, calls))
        return await future


def _serve_jobs(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The inference thread: run each job, hand its result (or its error) back to the job's event loop."""
    while (job := jobs.get()) is not None:
        loop, future, predict, encoded, calls = job
        result: _Result | None = None
        error: BaseException | None = None
        try:
            result = _predict_calls(predict, encoded, calls)
        except (StopIteration, asyncio.CancelledError) as exc:  # neither may be set on a future as a failure
            error = RuntimeError(f"inference raised {type(exc).__name__}")
        except BaseException as exc:  # the awaiting batch fails, not this thread
            error = exc
        with suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for this job any more
            loop.call_soon_threadsafe(_settle_job, future, result, error)


def _settle_job(future: asyncio.Future[_Result], result: _Result | None, error: BaseException | None) -> None:
    if future.done():  # cancelled: the batcher stopped while the job ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert result is not None
        future.set_result(result)


def _calls(encoded: Sequence[EncodedExample], max_batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """The inference calls of one batch (item indices), cut by the one batching rule (every window of a
    long utterance counts as a row)."""
    if len(encoded) == 1:
        return [[0]]  # one item is one call whatever its length (a single request: no sorting to do)
    widths = [e.width for e in encoded]
    rows = [len(e.rows) for e in encoded]
    return [list(idx) for idx in token_budget_batches(widths, max_batch_tokens, max_batch_size, rows)]


def _predict_calls(predict: PredictFn, encoded: list[EncodedExample], calls: Sequence[Iterable[int]]) -> _Result:
    """Run the inference calls of one batch (in the inference thread): predictions in the batch's
    order, (items, padded tokens, seconds) of each call, and when the last call ended."""
    predictions: list[Prediction | None] = [None] * len(encoded)
    timings: list[tuple[int, int, float]] = []
    for call in calls:
        start = time.perf_counter()
        idx = list(call)
        run = [encoded[i] for i in idx]
        got = predict(run)
        if len(got) != len(run):
            raise RuntimeError(f"predict returned {len(got)} predictions for {len(run)} items")
        for i, prediction in zip(idx, got, strict=True):
            predictions[i] = prediction
        timings.append((len(run), _padded(run, [range(len(run))]), time.perf_counter() - start))
    return [p for p in predictions if p is not None], timings, time.perf_counter()


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
    message = "the service is shutting down; retry on another instance"
    return NotReady(message, code="shutting_down", retry_after_s=retry_after_s)


def _fail_all(items: Sequence[Pending], exc: Exception) -> None:
    for item in items:
        _fail(item.future, exc)


def _fail(future: asyncio.Future[Prediction], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
