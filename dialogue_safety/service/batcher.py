"""Micro-batching: the rows of concurrent requests merged into inference batches, off the event loop.

A queue of pending items (an encoded example and the future its caller awaits), bounded by
admission (:mod:`dialogue_safety.service.admission`): a submission is encoded, charged its work
(tokens x windows x passes) and queued, or refused (429 or 413) before anything is queued. One
background task per **inference worker** (started and stopped in the app's lifespan) forms batches and
runs them, one at a time, in that worker's thread on its own session (the model's
:attr:`RowModel.workers`, ``SAFETY_INFERENCE_WORKERS``; the cores shared out between them).

The unit of scheduling is a **row**, not a request: an item is scored in rows
(:attr:`dialogue_safety.core.encoding.EncodedExample.model_rows`: each window of a long utterance, each
utterance-alone row), a batch is rows taken from the waiting items in turn
(:mod:`dialogue_safety.service.batch_queue`: classification before explanation, the clients of a lane by
turns of work), and it closes at ``max_batch_size`` rows, when the next row would take it past
``max_batch_tokens`` tokens (one inference call's worth), or at its deadline (``max_wait_s`` after its
first item arrived). So a long request's windows are spread over successive batches with other
clients' rows between them, and nobody waits behind more than one bounded batch. With two or more
workers, a client's rows run on one worker at a time while another client's rows wait, so a short
request runs beside a long one instead of behind it; a worker left idle takes a busy client's rows
only as a *borrowed* batch, stopped (its rows given back, unscored) the moment another client's rows
arrive and no worker is free. A batch runs in length-sorted inference calls of at most
``max_batch_tokens`` padded tokens each (rows x longest), cut by the one batching rule
(:func:`dialogue_safety.core.batch_budget.token_budget_batches`); each row's logits are kept with its
item, and an item is answered once all its rows are scored, on whichever workers: its rows are
combined by the runtime as a whole request's would be (:meth:`RowModel.predict_scored`), so its
verdict does not depend on how its rows were batched. The settings
(:class:`dialogue_safety.service.settings.ServiceSettings`) hold every default.

Encoding runs in a helper thread, coalesced (:mod:`dialogue_safety.service.encoder`), except a lone
short request to an idle batcher (``LONE_INLINE_CHARS``), encoded on the loop: one thread round trip
fewer, while no other request waits for the loop.

The single-request path stays lean: the batcher only waits for company when the last batch showed
concurrent traffic (it held rows of several items, or items arrived while it ran). Every future is
resolved or failed, and every item gives its admission charge back when its future settles: items
whose caller went away are dropped before inference (their rows not yet run); a failing batch fails
only the items it held rows of (:class:`InferenceFailed`); stopping fails what is left with
:class:`NotReady` (``shutting_down``). :meth:`MicroBatcher.drain` (the hot swap retiring the old model)
refuses new work but lets everything already admitted finish first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dialogue_safety.core.batch_budget import token_budget_batches
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import NotReady
from dialogue_safety.core.limits import too_many_windows
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.core.scoring import RowLogits
from dialogue_safety.service.admission import CLASSIFY, AdmissionGate, Charge, LaneName
from dialogue_safety.service.batch_observer import BatchObserver, NullObserver
from dialogue_safety.service.batch_queue import BatchQueue, Pending, Row
from dialogue_safety.service.encoder import EncodeCoalescer, EncodeFn, future_safe
from dialogue_safety.service.errors import InferenceFailed
from dialogue_safety.service.json_body import OFF_LOOP_BYTES
from dialogue_safety.service.settings import ServiceSettings

log = logging.getLogger("dialogue_safety.service.batcher")
# A lone request this short (utterance and history, in characters) to an idle batcher is encoded on the
# event loop: its tokenisation costs less than the round trip through the encoding thread, and no other
# request is waiting for the loop meanwhile (the history is truncated before it is tokenised).
LONE_INLINE_CHARS = 2_000


class RowModel(Protocol):
    """What the batcher runs (:class:`dialogue_safety.core.runtime.OnnxClassifier` has it all): rows of any
    items in one call on one of its workers, and the predictions of items whose rows are all scored."""

    @property
    def workers(self) -> int:
        """Sessions that run side by side (one inference thread each)."""
        ...

    @property
    def parallel(self) -> int:
        """How many of the workers run on cores of their own (a request's rows are shared out between so many)."""
        ...

    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: Any = None) -> np.ndarray:
        """[len(rows), heads] logits, each row run as it is, in order, on ``worker``; a set ``cancel`` stops it."""
        ...

    def cancel_token(self) -> Any:
        """A token for :meth:`row_logits` whose ``terminate = True`` (from another thread) stops the run."""
        ...

    def predict_scored(self, encoded: Sequence[EncodedExample], scored: RowLogits) -> list[Prediction]:
        """One prediction per item, from its rows' logits (``scored``), combined as a whole request's are."""
        ...


class Encoder(Protocol):
    """How submissions are encoded (:class:`dialogue_safety.service.encoder.EncodeCoalescer`)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def encode_inline(self, examples: Sequence[Example]) -> list[EncodedExample]: ...
    async def encode(self, examples: Sequence[Example]) -> list[EncodedExample]: ...


class MicroBatcher:
    """Merge the rows of submissions into batches for ``model`` (rows run in calls; an item predicted
    once its last row is scored). ``settings``: batch size and tokens, wait for company, Retry-After, admission budgets;
    ``gate``: the admission shared with other batchers of the service (default: one of its own, from
    ``settings``); ``encoder``: how submissions are encoded (default: an :class:`EncodeCoalescer` of ``encode``);
    ``on_failed``: called with the error when a worker's loop ends on one (the batcher takes no more work)."""

    def __init__(
        self,
        encode: EncodeFn,
        model: RowModel,
        settings: ServiceSettings,
        *,
        gate: AdmissionGate | None = None,
        observer: BatchObserver | None = None,
        encoder: Encoder | None = None,
        bound: Callable[[Sequence[Example], int], int] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._model = model
        self._on_failed = on_failed
        self._bound = bound  # what classify submissions cost at least, before encoding (core.limits.CostBound.at_least)
        self.max_batch_size = settings.max_batch_size
        self.max_batch_tokens = settings.max_batch_tokens
        self.max_wait_s = settings.max_wait_s
        self.retry_after_s = settings.retry_after_s
        self.gate = gate or AdmissionGate(
            settings.max_pending_tokens, settings.max_explain_tokens, retry_after_s=settings.retry_after_s
        )
        self._encoder: Encoder = encoder or EncodeCoalescer(encode, self._shutting_down)
        self._observer: BatchObserver = observer or NullObserver()
        self._queue: BatchQueue | None = None
        self._tasks: list[asyncio.Task[None]] = []  # the workers' loops
        self._workers = [_InferenceThread(k, settings.inference_nice) for k in range(max(1, model.workers))]
        self._parallel = max(1, model.parallel)  # workers with cores of their own
        self._done_lock = threading.Lock()  # the workers count an item's scored rows under it
        self._encoding = 0  # items admitted and being (or waiting to be) encoded
        self._entering = 0  # requests past their first check and not yet queued or refused (drain waits for them)
        self._accepting = self._stopped = self._draining = False
        self._running_batch = 0  # batches being run (one a worker at most)
        self._arrived_while_running = 0
        self._expect_company = False
        self._outstanding = 0  # futures handed out and not yet settled (drain waits for 0)
        self._settled: asyncio.Event | None = None  # set whenever outstanding, entering or encoding work ends

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        if self._tasks:
            raise RuntimeError("the batcher is already running")
        self._queue = BatchQueue(self._observer.observe_dropped)
        self._settled = asyncio.Event()
        self._settled.set()
        for worker in self._workers:
            worker.start()
        self._encoder.start()
        for worker in self._workers:
            task = asyncio.create_task(self._loop(worker), name=f"safety-micro-batcher-{worker.index}")
            task.add_done_callback(self._loop_ended)
            self._tasks.append(task)
        self._accepting = True

    async def stop(self) -> None:
        """Refuse new work, stop the loop, fail every pending future with ``shutting_down``."""
        self._accepting = False
        self._stopped = True
        tasks, self._tasks = self._tasks, []
        for worker in self._workers:
            worker.stop_job(always=True)  # the batch running is cut short: its callers are failed below
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._queue is not None:
            _fail_all(self._queue.take_all(), self._shutting_down())
        self._observe_depth(0)
        self._encoder.stop()  # what was not handed to the encoding thread yet fails too
        for worker in self._workers:
            worker.stop()

    async def drain(self, timeout_s: float) -> bool:
        """Let every request already in flight finish (admitted, or past its first check and still entering),
        refusing new work, then :meth:`stop`; True if all did in time. Cancelled, it still stops."""
        self._accepting = False
        self._draining = True
        drained = True
        try:
            async with asyncio.timeout(timeout_s):
                while self._settled is not None and (self._outstanding or self._encoding or self._entering):
                    self._settled.clear()
                    await self._settled.wait()
            drained = not self._stopped  # stopped meanwhile (the service stopping): what was left failed
        except TimeoutError:
            drained = False
        finally:
            await asyncio.shield(self.stop())  # a cancelled swap leaves no batcher running
        return drained

    def _settle(self, future: asyncio.Future[Prediction] | None = None) -> None:
        if future is not None:  # a handed-out future settled (None: an encoding or an entering request ended)
            self._outstanding -= 1
        if self._settled is not None:
            self._settled.set()  # drain() re-checks what is left

    @property
    def running(self) -> bool:
        return self._accepting and bool(self._tasks) and not any(task.done() for task in self._tasks)

    @property
    def depth(self) -> int:
        """Items waiting for a batch (not counting the batch being run)."""
        return len(self._queue) if self._queue is not None else 0

    def live_depth(self) -> int:
        """Items waiting whose caller still waits (cancelled ones are dropped when reached)."""
        return self._queue.live() if self._queue is not None else 0

    # -- admitting ------------------------------------------------------------------------------
    def _check_running(self, *, admitted: bool = False) -> None:
        # admitted: items charged before encoding; a draining batcher still takes them (in flight)
        in_flight = admitted and self._draining and bool(self._tasks) and not any(t.done() for t in self._tasks)
        if not (self._accepting or in_flight) or self._queue is None:
            raise self._shutting_down() if self._stopped else NotReady("the batcher is not running")

    # -- submitting -----------------------------------------------------------------------------
    async def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """``examples`` encoded as a submission would be (what an explanation's plan is sized by)."""
        self._check_running()
        return await self._encode(examples)

    async def enqueue(
        self,
        examples: Sequence[Example],
        *,
        client: str = "",
        lane: LaneName = CLASSIFY,
        at_least: int | None = None,
        entered: bool = False,
    ) -> list[asyncio.Future[Prediction]]:
        """Encode ``examples``, charge their work to ``client`` in ``lane`` and queue them together: one
        future each, to :meth:`release` when no longer awaited. An utterance longer than the window cap
        is not queued: its future holds the ``too_many_windows`` :class:`InvalidInput` at once.
        ``at_least``: what they cost at least, if the caller knows (an explanation: two sequences of its
        text); else, for the classify lane, the cost bound's figure from their characters. ``entered``: the
        request entered this batcher already (an explanation's plan, encoded by :meth:`encode` just before):
        a batcher that began draining since takes it, as it takes every request in flight."""
        arrived = asyncio.get_running_loop().time()  # for the batch deadline: encoding is waiting too
        if not examples:
            return []
        self._check_running(admitted=entered)
        self._entering += 1  # in flight from here: a drain waits for it to be queued or refused
        try:
            # before encoding: refusing must stay cheap under overload, and a request surely too costly by its
            # characters is never tokenised
            if at_least is None and self._bound is not None and lane == CLASSIFY:
                enough = self.gate.lane(lane).max_request_tokens
                if sum(len(e.utterance) for e in examples) > OFF_LOOP_BYTES:  # a regex pass over each character
                    at_least = await asyncio.to_thread(self._bound, examples, enough)
                else:
                    at_least = self._bound(examples, enough)
            self.admission(client, lane, at_least=at_least)
            encoded = await self._encode(examples)
            self._check_running(admitted=True)  # encoding awaited: the batcher may have stopped meanwhile
            # an utterance cut at the window cap is refused now, before its inference is paid for
            cut = {i for i, e in enumerate(encoded) if e.read.windows_needed > e.read.windows}
            kept = [e for i, e in enumerate(encoded) if i not in cut]
            if kept:
                charge = self.admission(client, lane, cost=sum(e.tokens for e in kept))
                assert charge is not None
                queued = iter(self._enqueue(kept, charge, lane, arrived))
            return [_refused(e) if i in cut else next(queued) for i, e in enumerate(encoded)]
        finally:
            self._entering -= 1
            self._settle()  # drain() re-checks what is left

    def admission(
        self, client: str, lane: LaneName = CLASSIFY, *, at_least: int | None = None, cost: int | None = None
    ) -> Charge | None:
        """The one place the admission rule (:class:`AdmissionGate`) is called from. With ``cost`` (the real
        cost, once encoded): charge it to ``client`` in ``lane`` (the :class:`Charge`), or raise 413/429. Without:
        raise the refusal a request of ``client`` gets before it is tokenised (413 when ``at_least``, what it
        costs at least, is more than one request may cost; 429 when its lane or its share is full even for one
        more token), else None. The service asks the same before a request's body is read
        (:meth:`dialogue_safety.service.state.ServiceState.early_refusal`)."""
        if cost is not None:
            return self.gate.admit(client, lane, cost)
        refusal = self.gate.refusal(client, lane, at_least)
        if refusal is not None:
            raise refusal
        return None

    async def _encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        n = len(examples)
        start = time.perf_counter()
        inline = self._lone_and_short(examples)
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
        return encoded

    def _lone_and_short(self, examples: Sequence[Example]) -> bool:
        """One short example and an idle batcher (no batch running, nothing queued or being encoded)."""
        if len(examples) != 1 or self._running_batch or self._encoding or self.depth:
            return False
        example = examples[0]
        chars = len(example.utterance) + sum(len(turn.text) for turn in example.history)
        return chars <= LONE_INLINE_CHARS

    def release(self, futures: Sequence[asyncio.Future[Prediction]]) -> None:
        """Cancel the futures still pending (their items are dropped, their charge given back); mark the
        failures of the others as retrieved."""
        for fut in futures:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()
        if any(fut.cancelled() for fut in futures):  # by this call or by the caller's hang-up: fewer items wait
            self._observe_depth(self.live_depth())

    def _enqueue(
        self, encoded: list[EncodedExample], charge: Charge, lane: LaneName, arrived: float
    ) -> list[asyncio.Future[Prediction]]:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Prediction]] = []
        for enc in encoded:  # no await in between: items stay together
            fut: asyncio.Future[Prediction] = loop.create_future()
            self._queue.put(Pending(enc, fut, arrived, charge, lane))
            fut.add_done_callback(self._settle)
            fut.add_done_callback(_give_back(charge, enc.tokens))
            futures.append(fut)
        self._outstanding += len(encoded)
        if self._running_batch:
            self._arrived_while_running += len(encoded)
            self._make_room(charge.client, lane)
        self._observe_depth(self.depth)  # O(1) here; a hang-up (release) and each batch count the live ones
        return futures

    def _observe_depth(self, depth: int) -> None:
        """The queue-depth gauge is the serving batcher's: one draining after a hot swap leaves it alone."""
        if not self._draining:
            self._observer.observe_queue_depth(depth)

    def _make_room(self, client: str, lane: LaneName) -> None:
        """``client``'s classification rows just arrived: if no worker is free for them, the client has no rows in
        flight (else they wait for its turn anyway) and a worker runs a borrowed batch, stop that batch (the
        latest started; its rows go back, unscored). An explanation never stops a batch: it goes after
        classifications anyway."""
        if lane != CLASSIFY or any(w.job is None for w in self._workers) or client in self._busy_clients():
            return
        borrowed = [w for w in self._workers if w.job is not None and w.job.borrowed and not w.job.stopped]
        if borrowed:
            max(borrowed, key=lambda w: w.job.started if w.job is not None else 0.0).stop_job()

    # -- the loop ---------------------------------------------------------------------------------
    async def _loop(self, worker: _InferenceThread) -> None:
        """One worker's loop: form a batch for it, run it, again."""
        while True:
            batch, borrowed = await self._next_batch()
            try:
                await self._run(batch, worker, borrowed)
            except asyncio.CancelledError:
                self._fail_stopped(batch)
                raise
            except Exception:  # a bug here must not stop the service: fail this batch only
                log.exception("micro-batcher: unexpected error; failing one batch and continuing")
                _fail_all(_items_of(batch), InferenceFailed())

    async def _next_batch(self) -> tuple[list[Row], bool]:
        assert self._queue is not None
        wait_s = self.max_wait_s if self._expect_company else 0.0  # company only when traffic is concurrent
        return await self._queue.next_batch(
            self.max_batch_size, wait_s, self._fail_stopped, self.max_batch_tokens, self._busy_clients, self._free
        )

    def _free(self) -> int:
        """Workers free (no batch running) to share the rows waiting between: no more than run on cores of their
        own (sharing a core, a request's rows gain nothing from two threads)."""
        return min(self._parallel, sum(1 for w in self._workers if w.job is None))

    def _busy_clients(self) -> set[str]:
        """The clients with rows in flight on a worker."""
        return {client for w in self._workers if w.job is not None for client in w.job.clients}

    async def _run(self, batch: list[Row], worker: _InferenceThread, borrowed: bool) -> None:
        assert self._queue is not None
        live = [row for row in batch if not row.item.future.done()]  # callers gone while waiting for company
        if len(live) < len(batch):
            self._queue.drop(_items_of(batch))
        self._observe_depth(self.live_depth())
        if not live:
            return
        now = asyncio.get_running_loop().time()
        for row in live:
            if not row.item.started:  # once per item: rows given back by a stopped batch run again later
                row.item.started = True
                self._observer.observe_queue_wait(now - row.item.enqueued)
        items = _items_of(live)
        calls = _calls([row.encoded for row in live], self.max_batch_tokens, self.max_batch_size)
        self._arrived_while_running = 0  # arrivals while this batch runs: traffic is concurrent
        self._running_batch += 1
        try:
            done, predictions, timings, unscored = await worker.run(
                _Job(self._model, live, calls, self._done_lock, borrowed, {item.client for item in items})
            )
        except Exception:
            # Log the failure without the inputs; fail only the items this batch held rows of.
            padded = _padded([row.encoded for row in live], calls)
            log.exception("inference failed for a batch of %d rows (%d padded tokens)", len(live), padded)
            self._observer.observe_batch_failure()
            _fail_all(items, InferenceFailed())
            return
        finally:
            self._running_batch -= 1
            self._expect_company = len(items) > 1 or self._arrived_while_running > 0
        for size, tokens, seconds in timings:
            self._observer.observe_batch(size, tokens, seconds)
        if unscored:  # a borrowed batch stopped for another client's rows: its rows wait again
            self._queue.put_back(unscored)
            self._observe_depth(self.live_depth())
        for item, prediction in zip(done, predictions, strict=True):
            if not item.future.done():
                item.future.set_result(prediction)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("micro-batcher loop stopped", exc_info=error)
            self._accepting = False
            if self._on_failed is not None:
                self._on_failed(error)

    def _fail_stopped(self, rows: Sequence[Row]) -> None:
        _fail_all(_items_of(rows), self._shutting_down())

    def _shutting_down(self) -> NotReady:
        return _shutting_down(self.retry_after_s)


def _items_of(rows: Sequence[Row]) -> list[Pending]:
    """The items ``rows`` belong to, once each, in order."""
    return list({id(row.item): row.item for row in rows}.values())


def _give_back(charge: Charge, tokens: int) -> Callable[[asyncio.Future[Prediction]], None]:
    """A done callback: the item's tokens go back to its admission lane, however its future settled."""

    def give_back(_future: asyncio.Future[Prediction]) -> None:
        charge.release(tokens)

    return give_back


@dataclass(eq=False)
class _Job:
    """One batch handed to a worker: its rows, cut into ``calls``; ``lock``: the batcher's, under which the
    workers count an item's scored rows; ``borrowed``: rows of clients busy on another worker, stopped with
    :meth:`_InferenceThread.stop_job` when another client needs the worker; ``cancel``: the model's token that
    stops the run (a borrowed job, or any job when the batcher stops)."""

    model: RowModel
    rows: list[Row]
    calls: list[list[int]]
    lock: threading.Lock
    borrowed: bool
    clients: set[str]
    started: float = field(default_factory=time.perf_counter)
    cancel: Any = field(init=False)
    stopped: bool = False

    def __post_init__(self) -> None:
        self.cancel = self.model.cancel_token()


# a job's items answered (all their rows scored), their predictions, (rows, padded tokens, seconds) of each call
# run, and the rows left unscored (a stopped borrowed job)
_Result = tuple[list[Pending], list[Prediction], list[tuple[int, int, float]], list[Row]]
_Handoff = tuple[asyncio.AbstractEventLoop, "asyncio.Future[_Result]", _Job]


class _InferenceThread:
    """One inference worker: the thread its batches run in, off the event loop, on the model's session
    ``index``. A job goes over a queue and its result comes back with one ``call_soon_threadsafe`` (no
    executor future chained to an asyncio one: the lone request's path is a hand-off each way and nothing
    more). ``job``: the one it runs (None: free)."""

    def __init__(self, index: int = 0, nice: int = 0) -> None:
        self.index = index
        self._nice = nice
        self.job: _Job | None = None
        self._jobs: queue.SimpleQueue[_Handoff | None] | None = None
        self._end: weakref.finalize[..., Any] | None = None

    def start(self) -> None:
        jobs: queue.SimpleQueue[_Handoff | None] = queue.SimpleQueue()
        self._jobs = jobs
        name = f"safety-inference-{self.index}"
        threading.Thread(target=_serve_jobs, args=(jobs, self.index, self._nice), name=name, daemon=True).start()
        self._end = weakref.finalize(self, jobs.put, None)  # a batcher dropped without stop() ends its thread too

    def stop(self) -> None:
        """The thread ends after the job it runs, if any (whose awaiting caller was cancelled first)."""
        if self._end is not None:
            self._end()  # puts the end of the jobs once
        self._jobs = self._end = None

    def stop_job(self, always: bool = False) -> None:
        """Stop the borrowed job running now (``always``: whichever runs, the batcher stopping): its calls not yet
        run are skipped, the one running is cut short."""
        job = self.job
        if job is not None and (job.borrowed or always) and not job.stopped:
            job.stopped = True
            job.cancel.terminate = True

    async def run(self, job: _Job) -> _Result:
        if self._jobs is None:
            raise RuntimeError("the inference thread is not running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Result] = loop.create_future()
        self.job = job
        try:
            self._jobs.put((loop, future, job))
            return await future
        finally:
            self.job = None


def _serve_jobs(jobs: queue.SimpleQueue[_Handoff | None], worker: int = 0, nice: int = 0) -> None:
    """A worker's thread: run each job, hand its result (or its error) back to the job's event loop.
    It runs ``nice`` steps below the process's priority (``SAFETY_INFERENCE_NICE``): when inference and the
    event loop share a core, the event loop runs first, so refusals and health checks stay fast under
    overload while inference takes the CPU left."""
    lower_thread_priority(nice)
    while (handoff := jobs.get()) is not None:
        loop, future, job = handoff
        result: _Result | None = None
        error: BaseException | None = None
        try:
            result = _score(job, worker)
        except BaseException as exc:  # the awaiting batch fails, not this thread
            error = future_safe(exc, "inference")
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


def _calls(rows: Sequence[EncodedExample], max_batch_tokens: int, max_batch_size: int) -> list[list[int]]:
    """The inference calls of one batch (row indices), cut by the one batching rule."""
    if len(rows) == 1:
        return [[0]]  # one row is one call (a lone short request: no sorting to do)
    return [idx.tolist() for idx in token_budget_batches([len(r) for r in rows], max_batch_tokens, max_batch_size)]


def _score(job: _Job, worker: int = 0) -> _Result:
    """Run one job on ``worker`` (in its thread): each call's rows, their logits kept with their items and
    counted under the job's lock; then the predictions of the items whose rows are now all scored (on this
    worker or another), from all their rows' logits. A stopped borrowed job leaves its rows not run."""
    model, rows = job.model, job.rows
    timings: list[tuple[int, int, float]] = []
    unscored: list[Row] = []
    done: list[Pending] = []
    for call in job.calls:
        if job.stopped:
            unscored.extend(rows[i] for i in call)
            continue
        start = time.perf_counter()
        run = [rows[i].encoded for i in call]
        try:
            logits = np.asarray(model.row_logits(run, worker, job.cancel))
        except Exception:
            if job.stopped:  # cut short on purpose
                unscored.extend(rows[i] for i in call)
                continue
            raise
        if logits.ndim != 2 or len(logits) != len(run):
            raise RuntimeError(f"row_logits returned {logits.shape} for {len(run)} rows")
        with job.lock:
            for i, row_logits in zip(call, logits, strict=True):
                item = rows[i].item
                if item.logits is None:
                    item.logits = np.empty((len(item.rows), logits.shape[1]), dtype=np.float32)
                item.logits[rows[i].index] = row_logits
                item.scored += 1
                if item.scored == len(item.rows):
                    done.append(item)
        timings.append((len(run), _padded(run, [range(len(run))]), time.perf_counter() - start))
    if not done:
        return [], [], timings, unscored
    predictions = model.predict_scored([item.encoded for item in done], _scored(done))
    if len(predictions) != len(done):
        raise RuntimeError(f"predict_scored returned {len(predictions)} predictions for {len(done)} items")
    return done, predictions, timings, unscored


def _scored(items: Sequence[Pending]) -> RowLogits:
    """The logits of the rows of ``items`` (each scored in whichever batch it ran in), looked up by row."""
    table = {id(row): item.logits[k] for item in items for k, row in enumerate(item.rows)}
    width = items[0].logits.shape[1]

    def scored(rows: Sequence[EncodedExample]) -> np.ndarray:
        if not rows:
            return np.zeros((0, width), dtype=np.float32)
        return np.stack([table[id(row)] for row in rows])

    return scored


def _padded(rows: Sequence[EncodedExample], calls: Sequence[Sequence[int]]) -> int:
    """Padded tokens of rows run in ``calls`` (rows x longest, per call)."""
    return sum(len(idx) * max(len(rows[i]) for i in idx) for idx in calls if len(idx))


def _shutting_down(retry_after_s: int) -> NotReady:
    message = "the service is shutting down; retry on another instance"
    return NotReady(message, code="shutting_down", retry_after_s=retry_after_s)


def _fail_all(items: Sequence[Pending], exc: Exception) -> None:
    for item in items:
        _fail(item.future, exc)


def _refused(encoded: EncodedExample) -> asyncio.Future[Prediction]:
    """The answer of an utterance cut at the window cap: its ``too_many_windows`` error, never queued."""
    future: asyncio.Future[Prediction] = asyncio.get_running_loop().create_future()
    future.set_exception(too_many_windows(encoded.read, encoded.read.windows))
    return future


def _fail(future: asyncio.Future[Prediction], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)


def lower_thread_priority(nice: int) -> int:
    """Lower the calling thread's OS priority by ``nice`` steps (Linux: a thread's own nice value; raising
    it needs no privilege). The thread's nice value after, or 0 where the OS has no such per-thread value."""
    if nice <= 0 or not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return 0
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError as exc:  # a sandbox that forbids it: inference keeps the process's priority
        log.warning("inference thread: could not lower its priority by %d (%s)", nice, exc)
        return 0
