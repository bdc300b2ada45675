"""MicroBatcher against a fake encode/predict: batching rules, ordering, admission by cost, lanes,
cancellation, failures and shutdown. No model, no HTTP, no timing assertions."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from service_conftest import GUARD_S, submit  # GUARD_S only against hangs; never asserted on

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import NotReady
from dialogue_safety.core.schema import Example, Label, Prediction
from dialogue_safety.service.admission import CLASSIFY, EXPLAIN, AdmissionGate
from dialogue_safety.service.batcher import LONE_INLINE_CHARS, MicroBatcher
from dialogue_safety.service.errors import InferenceFailed, Overloaded, RequestTooCostly
from dialogue_safety.service.settings import ServiceSettings

SETTINGS = {
    "max_batch_size",
    "max_batch_tokens",
    "max_wait_s",
    "max_pending_tokens",
    "max_explain_tokens",
    "retry_after_s",
    "inference_nice",
}


def batcher(encode: Any, model: Any, **kwargs: Any) -> MicroBatcher:
    """A MicroBatcher with the service's defaults (ServiceSettings), but for the settings in ``kwargs``."""
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in SETTINGS}
    wait_s = fields.pop("max_wait_s", None)
    settings = ServiceSettings(**fields)
    if wait_s is not None:  # beyond the setting's range too (GUARD_S * 10: 'never' in these tests)
        settings = settings.model_copy(update={"max_wait_ms": wait_s * 1000})
    if kwargs.pop("inline", False):
        kwargs["encoder"] = InlineEncoder(encode)
    return MicroBatcher(encode, model, settings, **kwargs)


class InlineEncoder:
    """Encodes every submission on the event loop, at once: the scenarios control exactly when items
    reach the queue (the service's encoder, a helper thread, is tested on its own)."""

    def __init__(self, encode: Any) -> None:
        self._encode = encode

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def encode_inline(self, examples: Sequence[Example]) -> list[EncodedExample]:
        return list(self._encode(examples))

    async def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        return self.encode_inline(examples)


def item(ident: int, n_tokens: int = 4) -> Example:
    """An example whose encoding carries ``ident`` and has ``n_tokens`` tokens."""
    return Example(utterance=f"{ident}:{n_tokens}")


class FakeModel:
    workers = parallel = 1

    @staticmethod
    def cancel_token() -> SimpleNamespace:
        return SimpleNamespace(terminate=False)

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()  # predict waits for it: clear() to hold batches, set() to release
        self.gate.set()
        self.entered = threading.Event()
        self.fail_ident: int | None = None
        self.hold_ident: int | None = None  # a call with this row waits for resume (held is set meanwhile)
        self.held = threading.Event()
        self.resume = threading.Event()

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        out = []
        for ex in examples:
            ident, n = (int(x) for x in ex.utterance.split(":"))
            ids = (101, ident, *([5] * (n - 3)), 102)[:n] if n >= 3 else (ident,) * n
            out.append(EncodedExample(ids, (0,) * len(ids), (1,) * len(ids)))
        return out

    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: object = None) -> np.ndarray:
        """One inference call: each row's ident (recorded per call in ``batches``)."""
        self.entered.set()
        assert self.gate.wait(GUARD_S)
        idents = [e.input_ids[1] if len(e) >= 3 else e.input_ids[0] for e in rows]
        if self.hold_ident in idents:
            self.held.set()
            assert self.resume.wait(GUARD_S)
        if self.fail_ident is not None and self.fail_ident in idents:
            raise RuntimeError("boom")
        self.batches.append(idents)
        return np.array([[i] for i in idents], dtype=np.float32)

    def predict_scored(self, encoded: Sequence[EncodedExample], scored: Any) -> list[Prediction]:
        """An item's score: the largest ident of its rows / 1000."""
        return [
            Prediction(score=float(scored(e.model_rows).max()) / 1000, label=Label.SAFE, threshold=0.5) for e in encoded
        ]


class RecordingObserver:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int]] = []
        self.dropped = 0
        self.failures = 0
        self.tokenizations = 0
        self.depths: list[int] = []
        self.waits = 0

    def observe_queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def observe_queue_wait(self, seconds: float) -> None:
        self.waits += 1

    def observe_tokenization(self, seconds: float) -> None:
        self.tokenizations += 1

    def observe_batch(self, size: int, padded_tokens: int, seconds: float) -> None:
        self.batches.append((size, padded_tokens))

    def observe_dropped(self, n: int) -> None:
        self.dropped += n

    def observe_batch_failure(self) -> None:
        self.failures += 1


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (bounded by GUARD_S)."""
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the batcher")
        await asyncio.sleep(0.001)


Scenario = Callable[[MicroBatcher, "FakeModel", "RecordingObserver"], Awaitable[Any]]


def run(coro_fn: Scenario, model: FakeModel | None = None, **kwargs: Any) -> tuple[Any, FakeModel, RecordingObserver]:
    """Run ``coro_fn(batcher, model, observer)`` with a started batcher; stop it afterwards.

    Submissions are encoded inline here (:class:`InlineEncoder`) so that the scenarios control exactly
    when items reach the queue; the service's encoder (a helper thread) is tested on its own."""
    kwargs.setdefault("inline", True)
    model = model or FakeModel()
    observer = RecordingObserver()

    async def main() -> Any:
        b = batcher(model.encode, model, observer=observer, **kwargs)
        await b.start()
        try:
            return await asyncio.wait_for(coro_fn(b, model, observer), GUARD_S)
        finally:
            await b.stop()

    return asyncio.run(main()), model, observer


async def finished(b: MicroBatcher) -> None:
    """Until the running batch has finished its bookkeeping (metrics)."""
    await until(lambda: not b._running_batch)


async def wait_entered(model: FakeModel) -> None:
    """Until the inference thread is inside predict (bounded)."""
    await asyncio.to_thread(model.entered.wait, GUARD_S)


def test_single_submission_and_order() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        one = await submit(b, [item(7)])
        many = await submit(b, [item(i) for i in (3, 1, 2)])
        return [p.score for p in one + many]

    scores, model, obs = run(body)
    assert scores == [0.007, 0.003, 0.001, 0.002]
    assert model.batches == [[7], [3, 1, 2]]
    assert obs.tokenizations == 2 and obs.waits == 4


def test_concurrent_submissions_share_a_batch_and_results_go_to_their_callers() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[list[float]]:
        first = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(m)  # batch [1] is running; the rest queue up behind it
        others = [asyncio.create_task(submit(b, [item(i), item(i + 100)])) for i in (2, 3, 4)]
        await asyncio.sleep(0)
        m.gate.set()
        return [[p.score for p in r] for r in await asyncio.gather(first, *others)]

    results, model, obs = run(body, model, max_batch_size=64)
    assert results == [[0.001], [0.002, 0.102], [0.003, 0.103], [0.004, 0.104]]
    assert model.batches == [[1], [2, 102, 3, 103, 4, 104]]
    assert [size for size, _ in obs.batches] == [1, 6]


def test_batches_close_at_max_batch_size() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[Prediction]:
        return await submit(b, [item(i) for i in range(10)])

    preds, model, _ = run(body, max_batch_size=4)
    assert [p.score for p in preds] == [i / 1000 for i in range(10)]
    assert model.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_batch_runs_in_length_sorted_calls_under_the_token_budget_padded_to_the_longest() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[Prediction]:
        # a batch holds at most one call's work (50 tokens; a first item always goes in): [1, 2, 3] (50),
        # [4] (10 + 60 > 50), [5] (60 alone: too much, still runs), [6]; inside a batch the calls are
        # sorted longest first and padded to their longest: 30 with a 10 would make 2 x 30 = 60 > 50
        return await submit(b, [item(1, 10), item(2, 10), item(3, 30), item(4, 10), item(5, 60), item(6, 10)])

    preds, model, obs = run(body, max_batch_tokens=50)
    assert [p.score for p in preds] == [0.001, 0.002, 0.003, 0.004, 0.005, 0.006]  # the caller's order
    assert model.batches == [[3], [1, 2], [4], [5], [6]]
    assert obs.batches == [(1, 30), (2, 20), (1, 10), (1, 60), (1, 10)]


def test_lone_request_does_not_wait_but_concurrent_traffic_waits_for_company() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        # A lone request with a huge max_wait comes back at once (the guard would fail otherwise).
        await asyncio.wait_for(submit(b, [item(1)]), GUARD_S / 2)
        # After a batch of several items the batcher expects company: a request that arrives a
        # few loop turns after another joins its batch (closed by size, not by the deadline).
        await submit(b, [item(2), item(3)])
        first = asyncio.create_task(submit(b, [item(4)]))
        for _ in range(5):
            await asyncio.sleep(0)
        second = asyncio.create_task(submit(b, [item(5)]))
        await asyncio.gather(first, second)

    _, model, _ = run(body, max_batch_size=2, max_wait_s=GUARD_S * 10)
    assert model.batches == [[1], [2, 3], [4, 5]]


def test_cancelled_requests_are_dropped_before_inference() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        running = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(m)
        gone = asyncio.create_task(submit(b, [item(2), item(3)]))
        stays = asyncio.create_task(submit(b, [item(4)]))
        gone_single = asyncio.create_task(submit(b, [item(5)]))
        await asyncio.sleep(0)
        gone.cancel()
        gone_single.cancel()
        await asyncio.gather(gone, gone_single, return_exceptions=True)
        m.gate.set()
        await running
        return [p.score for p in await stays]

    scores, model, obs = run(body, model)
    assert scores == [0.004]
    assert model.batches == [[1], [4]]
    assert obs.dropped == 3


def test_enqueued_futures_released_by_the_caller_are_dropped() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        running = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(m)
        futures = await b.enqueue([item(2), item(3)])
        b.release(futures)  # the HTTP client disconnected
        m.gate.set()
        await running
        await submit(b, [item(4)])

    _, model, obs = run(body, model)
    assert model.batches == [[1], [4]]
    assert obs.dropped == 2


def test_a_failing_batch_fails_only_its_requests_and_the_batcher_keeps_serving() -> None:
    model = FakeModel()
    model.gate.clear()
    model.fail_ident = 3

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[object]:
        before = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(m)
        doomed = [asyncio.create_task(submit(b, [item(i)])) for i in (2, 3)]  # one batch: [2, 3]
        await asyncio.sleep(0)
        m.gate.set()
        results = await asyncio.gather(before, *doomed, return_exceptions=True)
        after = await submit(b, [item(4), item(5)])
        return [*results, after]

    results, model, obs = run(body, model, max_batch_size=2)
    assert [p.score for p in results[0]] == [0.001]
    assert isinstance(results[1], InferenceFailed) and isinstance(results[2], InferenceFailed)
    assert [p.score for p in results[3]] == [0.004, 0.005]
    assert obs.failures == 1
    assert model.batches == [[1], [4, 5]]


def test_stop_fails_pending_requests_and_refuses_new_ones() -> None:
    model = FakeModel()
    model.gate.clear()

    async def main() -> None:
        b = batcher(model.encode, model, inline=True)
        with pytest.raises(NotReady):
            await submit(b, [item(0)])  # not started
        await b.start()
        running = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(model)
        queued = asyncio.create_task(submit(b, [item(2), item(3)]))
        await asyncio.sleep(0)
        await b.stop()
        model.gate.set()
        for task in (running, queued):
            with pytest.raises(NotReady) as info:
                await asyncio.wait_for(task, GUARD_S)
            assert info.value.code == "shutting_down"
        with pytest.raises(NotReady):
            await submit(b, [item(4)])

    asyncio.run(main())


def test_large_submissions_are_encoded_off_the_loop_with_the_same_results() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        return [p.score for p in await submit(b, [item(i) for i in range(40)])]

    scores, _, _ = run(body, inline=False)
    assert scores == [i / 1000 for i in range(40)]


def test_invalid_configuration_is_refused() -> None:
    model = FakeModel()
    with pytest.raises(ValueError):
        batcher(model.encode, model, max_batch_size=0)


def test_stop_while_a_batch_waits_for_company_fails_its_items() -> None:
    model = FakeModel()

    async def main() -> None:
        b = batcher(model.encode, model, max_batch_size=8, max_wait_s=GUARD_S * 10, inline=True)
        await b.start()
        await submit(b, [item(1), item(2)])  # concurrent traffic: the next batch waits for company
        waiting = asyncio.create_task(submit(b, [item(3)]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done()
        await b.stop()
        with pytest.raises(NotReady) as info:
            await asyncio.wait_for(waiting, GUARD_S)
        assert info.value.code == "shutting_down"

    asyncio.run(main())
    assert model.batches == [[1, 2]]


def test_drain_finishes_queued_and_running_work_then_refuses_new_work() -> None:
    model = FakeModel()
    model.gate.clear()

    async def main() -> None:
        b = batcher(model.encode, model, max_batch_size=2)
        await b.start()
        running = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(model)
        queued = asyncio.create_task(submit(b, [item(2), item(3), item(4)]))
        await asyncio.sleep(0)
        draining = asyncio.create_task(b.drain(GUARD_S))
        await asyncio.sleep(0)
        with pytest.raises(NotReady):
            await submit(b, [item(5)])  # new work goes elsewhere (the hot swap's new batcher)
        assert not draining.done()
        model.gate.set()
        assert await asyncio.wait_for(draining, GUARD_S) is True
        assert [p.score for p in await running] == [0.001]
        assert [p.score for p in await queued] == [0.002, 0.003, 0.004]
        assert not b.running

    asyncio.run(main())


def test_drain_lets_a_submission_still_being_encoded_finish_on_this_batcher() -> None:
    model = FakeModel()
    encoding, release = threading.Event(), threading.Event()
    encode = model.encode

    def slow_encode(examples: Any) -> Any:
        encoding.set()
        assert release.wait(GUARD_S)
        return encode(examples)

    async def main() -> None:
        b = batcher(slow_encode, model)  # the default: several items are encoded in the helper thread
        await b.start()
        in_flight = asyncio.create_task(submit(b, [item(1), item(2)]))
        await asyncio.to_thread(encoding.wait, GUARD_S)
        draining = asyncio.create_task(b.drain(GUARD_S))
        await asyncio.sleep(0)
        with pytest.raises(NotReady):
            await submit(b, [item(2)])  # new work is refused before encoding
        assert not draining.done()
        release.set()
        assert await asyncio.wait_for(draining, GUARD_S) is True
        assert [p.score for p in await in_flight] == [0.001, 0.002]  # admitted before the drain: served here

    asyncio.run(main())


def test_stop_fails_submissions_still_waiting_to_be_encoded() -> None:
    model = FakeModel()
    encoding, release = threading.Event(), threading.Event()
    encode = model.encode

    def slow_encode(examples: Any) -> Any:
        encoding.set()
        assert release.wait(GUARD_S)
        return encode(examples)

    async def main() -> list[object]:
        b = batcher(slow_encode, model)
        await b.start()
        in_thread = asyncio.create_task(submit(b, [item(1), item(3)]))
        await asyncio.to_thread(encoding.wait, GUARD_S)
        waiting = asyncio.create_task(submit(b, [item(2)]))  # waits for the busy encoding thread
        await asyncio.sleep(0)
        await b.stop()
        release.set()
        return list(await asyncio.wait_for(asyncio.gather(in_thread, waiting, return_exceptions=True), GUARD_S))

    results = asyncio.run(main())
    assert all(isinstance(r, NotReady) and r.code == "shutting_down" for r in results), results


@pytest.mark.parametrize("ends", ["timeout", "cancelled"])
def test_a_drain_that_ends_before_its_work_stops_the_batcher_and_fails_what_is_left(ends: str) -> None:
    """A drain that gives up after its timeout says so (False); one cancelled while it waits (a hot swap cancelled
    at shutdown) still stops: either way the running batch is cut short, nothing is left running, and the running
    and queued callers fail shutting down."""
    model = FakeModel()
    model.gate.clear()

    async def main() -> None:
        b = batcher(model.encode, model)
        await b.start()
        running = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(model)
        queued = asyncio.create_task(submit(b, [item(2)]))
        await asyncio.sleep(0)
        if ends == "timeout":
            assert await b.drain(0.01) is False
        else:
            draining = asyncio.create_task(b.drain(GUARD_S))
            await asyncio.sleep(0.01)
            draining.cancel()
            with pytest.raises(asyncio.CancelledError):
                await draining
        assert not b.running
        model.gate.set()
        for task in (running, queued):
            with pytest.raises(NotReady) as refused:
                await asyncio.wait_for(task, GUARD_S)
            assert refused.value.code == "shutting_down"

    asyncio.run(main())


def test_a_submission_of_several_items_is_encoded_off_the_event_loop() -> None:
    model = FakeModel()
    threads: list[str] = []
    encode = model.encode

    def recording_encode(examples: Any) -> Any:
        threads.append(threading.current_thread().name)
        return encode(examples)

    async def main() -> list[float]:
        b = batcher(recording_encode, model)
        await b.start()
        try:
            return [p.score for p in await submit(b, [item(1), item(2)])]
        finally:
            await b.stop()

    assert asyncio.run(main()) == [0.001, 0.002]
    assert threads and all(name.startswith("safety-encode") for name in threads)


def test_a_lone_short_request_to_an_idle_batcher_is_encoded_on_the_loop() -> None:
    """A lone request of at most ``LONE_INLINE_CHARS`` to an idle batcher is encoded on the event loop;
    a longer one, several items, or one arriving while a batch runs go to the encoding thread."""
    model = FakeModel()
    threads: list[tuple[str, str]] = []
    encode = model.encode

    def recording_encode(examples: Any) -> Any:
        threads.extend((e.utterance, threading.current_thread().name) for e in examples)
        return encode(examples)

    long_one = Example(utterance="9:4" + " " * LONE_INLINE_CHARS)  # over the limit

    async def main() -> None:
        b = batcher(recording_encode, model)
        await b.start()
        try:
            await submit(b, [item(1)])  # idle and short: on the loop
            await finished(b)
            await submit(b, [long_one])  # too long
            await finished(b)
            await submit(b, [item(2), item(3)])  # not alone
            await finished(b)
            model.gate.clear()
            model.entered.clear()
            running = asyncio.create_task(submit(b, [item(4)]))  # idle again: on the loop, then held
            await wait_entered(model)
            behind = asyncio.create_task(submit(b, [item(5)]))  # a batch runs: the encoding thread
            await until(lambda: b.depth == 1)
            model.gate.set()
            await asyncio.wait_for(asyncio.gather(running, behind), GUARD_S)
        finally:
            await b.stop()

    asyncio.run(main())
    loop_thread = threading.main_thread().name
    where = {utterance.split(":")[0]: name for utterance, name in threads}
    assert where["1"] == loop_thread and where["4"] == loop_thread, threads
    for ident in ("9", "2", "3", "5"):
        assert where[ident].startswith("safety-encode"), threads


@pytest.mark.parametrize("raised", [StopIteration, asyncio.CancelledError])
def test_predict_raising_what_a_future_cannot_hold_fails_that_batch_only(raised: type[BaseException]) -> None:
    """StopIteration cannot be set on a future and CancelledError would end the batcher's loop: either
    raised by predict fails its batch (InferenceFailed) and the next request is answered."""

    class Raising(FakeModel):
        calls = 0

        def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: object = None) -> np.ndarray:
            self.calls += 1
            if self.calls == 1:
                raise raised
            return super().row_logits(rows)

    model = Raising()

    async def main() -> list[str]:
        b = batcher(model.encode, model)
        await b.start()
        outcomes = []
        try:
            for ident in (1, 2):
                try:
                    await asyncio.wait_for(submit(b, [item(ident)]), GUARD_S)
                    outcomes.append("answered")
                except InferenceFailed:
                    outcomes.append("failed")
        finally:
            await b.stop()
        return outcomes

    assert asyncio.run(main()) == ["failed", "answered"]


def test_a_batcher_dropped_without_stop_ends_its_inference_thread() -> None:
    # the inference threads this test starts (one an earlier test left may still be ending: not counted)
    before = {t for t in threading.enumerate() if t.name == "safety-inference"}

    def alive() -> int:
        return sum(t.name == "safety-inference" and t not in before for t in threading.enumerate())

    async def main() -> None:
        model = FakeModel()
        for _ in range(5):
            b = batcher(model.encode, model)
            await b.start()
            await submit(b, [item(1)])
            assert b._tasks
            for task in b._tasks:
                task.cancel()  # never stopped: only dropped
            await asyncio.gather(*b._tasks, return_exceptions=True)
            del b

    asyncio.run(main())
    gc.collect()
    deadline = time.monotonic() + GUARD_S
    while alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert alive() == 0


def test_queue_depth_gauge_drops_when_waiting_callers_leave() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        running = asyncio.create_task(submit(b, [item(1)]))
        await wait_entered(m)
        futures = await b.enqueue([item(2), item(3)])
        assert o.depths[-1] == 2
        b.release(futures)
        assert o.depths[-1] == 0  # not stuck at 2 until the next batch forms
        m.gate.set()
        await running

    run(body, model)


@pytest.mark.parametrize(
    ("raised", "answered"),
    [(ValueError, ValueError), (StopIteration, RuntimeError), (asyncio.CancelledError, RuntimeError)],
)
def test_concurrent_submissions_are_encoded_together_and_a_failing_one_is_isolated(
    raised: type[BaseException], answered: type[BaseException]
) -> None:
    """Submissions waiting for the encoding thread are encoded in one call; one whose encoding raises gets the
    error (StopIteration and CancelledError, which a future cannot carry to its caller as such, as a RuntimeError),
    the others their results, and the encoding thread serves the next submissions."""
    model = FakeModel()
    calls: list[int] = []
    encode = model.encode

    def counting_encode(examples: Any) -> Any:
        calls.append(len(examples))
        if any(ex.utterance == "poison" for ex in examples):
            raise raised("cannot encode this one")
        return encode(examples)

    async def main() -> tuple[list[object], list[float]]:
        b = batcher(counting_encode, model)
        await b.start()
        try:
            subs = [submit(b, [item(i)]) for i in range(1, 9)]
            subs.append(submit(b, [Example(utterance="poison")]))
            results = await asyncio.wait_for(asyncio.gather(*subs, return_exceptions=True), GUARD_S)
            later = await asyncio.wait_for(submit(b, [item(10), item(11)]), GUARD_S)
            return list(results), [p.score for p in later]
        finally:
            await b.stop()

    results, later = asyncio.run(main())
    assert [p[0].score for p in results[:8]] == [i / 1000 for i in range(1, 9)]  # type: ignore[index]
    assert type(results[8]) is answered
    assert later == [0.01, 0.011]
    assert max(calls) > 1  # at least one round encoded several submissions in one call


class WindowedModel(FakeModel):
    """``"ident:n:w"``: an item of ``w`` windows of ``n`` tokens (a long utterance); ``"ident:n:w:a"``: with an
    utterance-alone row of ``a`` tokens too (a decomposed encoding with history). Window ``k`` > 0 carries the
    ident ``10 * ident + k``, the alone row ``-ident``, so that the rows of each call can be told apart."""

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        out = []
        for ex in examples:
            ident, n, windows, *alone = (int(x) for x in ex.utterance.split(":"))
            (row,) = super().encode([Example(utterance=f"{ident}:{n}")])
            more = tuple(
                FakeModel.encode(self, [Example(utterance=f"{10 * ident + k}:{n}")])[0] for k in range(1, windows)
            )
            extra = FakeModel.encode(self, [Example(utterance=f"{-ident}:{alone[0]}")])[0] if alone else None
            out.append(dataclasses.replace(row, more=more, alone=extra))
        return out


def test_the_token_budget_counts_every_row_and_a_long_items_windows_are_spread_over_batches() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[Prediction]:
        return await submit(b, [Example(utterance="1:10:3"), Example(utterance="2:10:1"), Example(utterance="3:10:1")])

    # 3 windows of 10 + 1 row of 10 = 40 tokens fit a budget of 40; the third item goes on
    preds, model, obs = run(body, WindowedModel(), max_batch_tokens=40)
    assert model.batches == [[1, 11, 12, 2], [3]]
    assert obs.batches == [(4, 40), (1, 10)]
    assert [p.score for p in preds] == [0.012, 0.002, 0.003]  # the item's rows combined (here: their maximum)
    # a budget of 30: the first item's third window goes into the next batch, beside the next item's row
    preds, model, obs = run(body, WindowedModel(), max_batch_tokens=30)
    assert model.batches == [[1, 11, 12], [2, 3]] and obs.batches == [(3, 30), (2, 20)]
    preds, model, obs = run(body, WindowedModel(), max_batch_tokens=20)
    assert model.batches == [[1, 11], [12, 2], [3]]  # the long item answered after its last row, in batch 2
    assert [p.score for p in preds] == [0.012, 0.002, 0.003]


def test_the_utterance_alone_rows_are_rows_of_the_batch_padded_per_call() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[Prediction]:
        items = [Example(utterance="1:10:1:4"), Example(utterance="2:6:1"), Example(utterance="3:8:1:7")]
        return await submit(b, items)

    preds, model, obs = run(body, WindowedModel())
    # one batch, one call, sorted longest first: 5 rows padded to 10
    assert model.batches == [[1, 3, -3, 2, -1]] and obs.batches == [(5, 50)]
    assert [p.score for p in preds] == [0.001, 0.002, 0.003]
    preds, model, obs = run(body, WindowedModel(), max_batch_tokens=16)
    # 16 tokens a batch, the rows in turn: [1, -1] (14 tokens, but 2 x 10 padded: two calls), [2, 3], [-3]
    assert model.batches == [[1], [-1], [3, 2], [-3]]
    assert obs.batches == [(1, 10), (1, 4), (2, 16), (1, 7)]
    assert [p.score for p in preds] == [0.001, 0.002, 0.003]


def test_another_clients_row_goes_between_the_windows_of_a_long_request() -> None:
    """The unit of scheduling is a row: a client's short request waits for one batch of a long request's
    windows, not for all of them, and is answered first."""
    model = WindowedModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[str]:
        running = asyncio.create_task(submit(b, [Example(utterance="1:10:1")], client="a"))
        await wait_entered(m)
        long = asyncio.create_task(submit(b, [Example(utterance="2:10:6")], client="a"))
        await until(lambda: b.depth == 1)
        short = asyncio.create_task(submit(b, [Example(utterance="3:10:1")], client="b"))
        await until(lambda: b.depth == 2)
        m.gate.set()
        first, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(running, long, short)
        assert [p.score for p in long.result()] == [0.025] and [p.score for p in short.result()] == [0.003]
        return ["short" if t is short else "long" for t in first]

    first, model, _ = run(body, model, max_batch_tokens=20)
    assert first == ["short"]
    # 20 tokens a batch: the long request's first window and the other client's row, then the other windows
    assert model.batches == [[1], [2, 3], [21, 22], [23, 24], [25]]


def test_busy_clients_take_turns_row_by_row_and_a_newcomer_waits_for_one_row_of_each() -> None:
    model = WindowedModel()
    model.gate.clear()
    model.hold_ident = 21  # the inference thread holds the batch of a's second window

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        running = asyncio.create_task(submit(b, [Example(utterance="1:10:1")], client="x"))
        await wait_entered(m)
        a = asyncio.create_task(submit(b, [Example(utterance="2:10:4")], client="a"))
        b_ = asyncio.create_task(submit(b, [Example(utterance="3:10:4")], client="b"))
        await until(lambda: b.depth == 2)
        m.gate.set()
        await asyncio.to_thread(m.held.wait, GUARD_S)  # [1], [2], [3] ran; a and b are both busy
        c = asyncio.create_task(submit(b, [Example(utterance="4:10:1")], client="c"))
        await until(lambda: b.depth == 3)
        m.resume.set()
        await asyncio.gather(running, a, b_, c)

    _, model, _ = run(body, model, max_batch_tokens=10, max_pending_tokens=1000)
    assert all(len(batch) == 1 for batch in model.batches)  # 10 tokens a batch: one row each
    rows = [batch[0] for batch in model.batches]
    # a and b in turn; the newcomer after the row running when it came (21) and b's turn at the same tag,
    # before a's next row
    assert rows == [1, 2, 3, 21, 31, 4, 22, 32, 23, 33]


def test_a_long_request_whose_caller_goes_away_is_dropped_between_its_rows_and_gives_its_charge_back() -> None:
    model = WindowedModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> tuple[int, int]:
        lane = b.gate.lane("classify")
        futures = await b.enqueue([Example(utterance="2:10:5")], client="a")
        await wait_entered(m)  # its first window runs (10 tokens a batch)
        b.release(futures)  # the HTTP client hung up
        await asyncio.sleep(0)
        charged = lane.charged
        m.gate.set()
        answer = await submit(b, [Example(utterance="3:10:1")], client="b")
        assert [p.score for p in answer] == [0.003]
        return charged, lane.charged

    (charged, after), model, obs = run(body, model, max_batch_tokens=10)
    assert charged == 0 and after == 0
    assert model.batches == [[2], [3]]  # its other four windows never ran
    assert obs.dropped == 1


def test_a_failing_row_fails_its_request_and_the_rest_of_its_rows_never_run() -> None:
    model = WindowedModel()
    model.fail_ident = 22
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[object]:
        running = asyncio.create_task(submit(b, [Example(utterance="1:10:1")], client="x"))
        await wait_entered(m)
        doomed = asyncio.create_task(submit(b, [Example(utterance="2:10:5")], client="a"))
        other = asyncio.create_task(submit(b, [Example(utterance="3:10:3")], client="b"))
        await until(lambda: b.depth == 2)
        m.gate.set()
        return list(await asyncio.gather(running, doomed, other, return_exceptions=True))

    # 10 tokens a batch: a row each, a's and b's in turn; the batch of a's third window fails, b's rows go on
    (running, doomed, other), model, obs = run(body, model, max_batch_tokens=10)
    assert model.batches == [[1], [2], [3], [21], [31], [32]]
    assert isinstance(doomed, InferenceFailed)
    assert [p.score for p in other] == [0.032]  # type: ignore[attr-defined]
    assert not any(ident in (23, 24) for batch in model.batches for ident in batch)
    assert obs.failures == 1 and obs.dropped == 0  # failed, not gone


def test_stop_fails_a_request_whose_rows_were_partly_scored() -> None:
    model = WindowedModel()
    model.gate.clear()

    model.hold_ident = 22  # its third window's batch is held

    async def main() -> None:
        b = batcher(model.encode, model, max_batch_tokens=10, inline=True)
        await b.start()
        long = asyncio.create_task(submit(b, [Example(utterance="2:10:4")]))
        queued = asyncio.create_task(submit(b, [Example(utterance="3:10:3")], client="b"))
        await wait_entered(model)
        model.gate.set()
        await asyncio.to_thread(model.held.wait, GUARD_S)
        await b.stop()
        model.resume.set()
        for task in (long, queued):
            with pytest.raises(NotReady) as info:
                await asyncio.wait_for(task, GUARD_S)
            assert info.value.code == "shutting_down"

    asyncio.run(main())
    assert model.batches[:4] == [[2], [3], [21], [31]]  # then [22] was held, and answered nobody
    assert not {23, 32} & {ident for batch in model.batches for ident in batch}  # nothing ran after it


# -- admission: charged by cost, two lanes, fair share ---------------------------------------------------
def test_a_submission_is_charged_its_tokens_windows_and_passes_until_answered() -> None:
    model = WindowedModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[int]:
        lane = b.gate.lane("classify")
        running = asyncio.create_task(submit(b, [Example(utterance="1:10:3"), Example(utterance="2:5:1")]))
        await wait_entered(m)
        charged = [lane.charged]  # 3 windows of 10 tokens + 1 row of 5
        m.gate.set()
        await running
        await until(lambda: lane.charged == 0)
        return [*charged, lane.charged, len(lane.clients)]

    charged, _, _ = run(body, model)
    assert charged == [35, 0, 0]


def test_the_second_pass_of_a_decomposed_item_is_charged() -> None:
    one = EncodedExample((1,) * 10, (0,) * 10, (1,) * 10, alone=EncodedExample((1,) * 4, (0,) * 4, (1,) * 4))
    gate = AdmissionGate(100, 100)
    charge = gate.admit("a", "classify", one.tokens)
    assert one.tokens == 14 and gate.lane("classify").charged == 14
    charge.release(10)
    charge.release(10)  # never more than was charged
    assert gate.lane("classify").charged == 0 and charge.left == 0


def test_a_full_lane_refuses_with_retry_after_then_admits_again() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        running = asyncio.create_task(submit(b, [item(1, 10)], client="a"))
        await wait_entered(m)
        queued = asyncio.create_task(submit(b, [item(2, 10)], client="b"))
        await until(lambda: b.depth == 1)
        third = asyncio.create_task(submit(b, [item(3, 10)], client="c"))  # 30 of 40: fits c's share (13)
        await until(lambda: b.depth == 2)
        with pytest.raises(Overloaded) as full:
            await submit(b, [item(4, 12)], client="d")  # 30 + 12 > 40
        assert full.value.headers["Retry-After"] == "1" and "SAFETY_MAX_PENDING_TOKENS" in full.value.message
        assert b.gate.refusal("e") is None  # one more token still fits
        m.gate.set()
        await asyncio.gather(running, queued, third)
        return [p.score for p in await submit(b, [item(4, 12)], client="d")]

    scores, model, _ = run(body, model, max_pending_tokens=40)
    assert scores == [0.004]
    assert sum(model.batches, []) == [1, 2, 3, 4]


def test_a_request_costing_more_than_half_a_lane_is_refused_for_good_with_413() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        with pytest.raises(RequestTooCostly) as info:
            await submit(b, [item(1, 10), item(2, 11)])  # 21 tokens, an idle batcher: still refused
        assert "at most 20" in info.value.message and "SAFETY_MAX_PENDING_TOKENS (40)" in info.value.message
        assert [p.score for p in await submit(b, [item(1, 10), item(2, 10)])] == [0.001, 0.002]

    _, model, _ = run(body, max_pending_tokens=40)
    assert model.batches == [[1, 2]]


def test_one_client_holds_at_most_a_fair_share_and_another_client_is_admitted() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        lane = b.gate.lane("classify")
        greedy = [asyncio.create_task(submit(b, [item(i, 10)], client="greedy")) for i in (1, 2)]
        await wait_entered(m)
        await until(lambda: lane.charged == 20)
        with pytest.raises(Overloaded) as share:  # alone, it may hold half the lane (20 of 40)
            await submit(b, [item(3, 5)], client="greedy")
        assert "fair share" in share.value.message
        polite = asyncio.create_task(submit(b, [item(4, 10)], client="polite"))  # admitted, not 429
        await until(lambda: lane.charged == 30)
        with pytest.raises(Overloaded):  # two clients hold work: 40 / 2 each, and the greedy one holds 20
            await submit(b, [item(5, 1)], client="greedy")
        m.gate.set()
        await asyncio.gather(*greedy, polite)

    _, model, _ = run(body, model, max_pending_tokens=40)
    assert sorted(sum(model.batches, [])) == [1, 2, 4]


def test_fair_share_divides_a_lane_among_the_clients_holding_work() -> None:
    gate = AdmissionGate(90, 10)
    gate.admit("a", "classify", 30)
    gate.admit("b", "classify", 20)
    lane = gate.lane("classify")
    assert lane.fair_share("a") == 45 and lane.fair_share("c") == 30  # a newcomer counts itself
    with pytest.raises(Overloaded):
        gate.admit("a", "classify", 16)  # 46 > 45
    gate.admit("c", "classify", 30)
    assert lane.fair_share("a") == 30 and gate.refusal("a") is not None and gate.refusal("b") is None


def test_explanations_are_charged_to_their_own_lane_and_never_refuse_a_classification() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        running = asyncio.create_task(submit(b, [item(1, 4)], client="x"))
        await wait_entered(m)
        explained = asyncio.create_task(submit(b, [item(i, 10) for i in (10, 11)], client="x", lane=EXPLAIN))
        await until(lambda: b.depth == 2)
        other = asyncio.create_task(submit(b, [item(20, 20)], client="z", lane=EXPLAIN))
        await until(lambda: b.depth == 3)
        assert b.gate.lane("explain").charged == 40 and b.gate.lane("classify").charged == 4
        with pytest.raises(Overloaded):
            await submit(b, [item(12, 4)], client="y", lane=EXPLAIN)  # the explain lane is full
        classified = asyncio.create_task(submit(b, [item(2, 10)], client="y"))  # the classify lane is not
        await until(lambda: b.depth == 4)
        m.gate.set()
        await asyncio.gather(running, explained, other, classified)

    _, model, _ = run(body, model, max_explain_tokens=40, max_batch_size=2)
    # the classification queued after the explanation runs first; the explanation fills the room left
    assert model.batches == [[1], [2, 10], [20, 11]]  # a batch runs longest first


def test_a_caller_that_goes_away_gives_its_charge_back_at_once() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> int:
        running = asyncio.create_task(submit(b, [item(1, 10)], client="a"))
        await wait_entered(m)
        futures = await b.enqueue([item(2, 10), item(3, 10)], client="b")
        assert b.gate.lane("classify").charged == 30
        b.release(futures)  # the HTTP client hung up
        await asyncio.sleep(0)
        charged = b.gate.lane("classify").charged
        m.gate.set()
        await running
        await submit(b, [item(4)])
        return charged

    charged, model, obs = run(body, model)
    assert charged == 10 and model.batches == [[1], [4]] and obs.dropped == 2


def test_one_max_batch_size_default() -> None:
    """The service's setting, the runtime's and torch inference's default are one constant (were 64, 256, 256)."""
    import inspect

    from dialogue_safety.core.batch_budget import MAX_BATCH_SIZE
    from dialogue_safety.core.runtime import OnnxClassifier

    assert ServiceSettings.model_fields["max_batch_size"].default == MAX_BATCH_SIZE
    assert inspect.signature(OnnxClassifier).parameters["max_batch_size"].default == MAX_BATCH_SIZE
    assert "max_batch_size" not in inspect.signature(MicroBatcher).parameters  # the batcher repeats no default


def test_clients_take_turns_so_a_large_request_does_not_hold_back_another_clients_item() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        running = asyncio.create_task(submit(b, [item(1)], client="a"))
        await wait_entered(m)
        large = asyncio.create_task(submit(b, [item(i) for i in range(10, 16)], client="a"))
        await until(lambda: b.depth == 6)
        other = asyncio.create_task(submit(b, [item(20)], client="b"))
        await until(lambda: b.depth == 7)
        m.gate.set()
        await asyncio.gather(running, large, other)

    _, model, _ = run(body, model, max_batch_size=2)
    # the other client's item runs in the next batch, beside the large request's first item, not after it all
    assert model.batches == [[1], [10, 20], [11, 12], [13, 14], [15]]


def test_a_batch_holds_at_most_one_calls_work_so_another_client_waits_one_call_not_a_whole_request() -> None:
    """Batches are cut by size *and* by ``max_batch_tokens`` of work: a batch of a large request's items
    would run call after call while a newcomer's item waited for all of them."""
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        running = asyncio.create_task(submit(b, [item(1, 40)], client="a"))
        await wait_entered(m)
        large = asyncio.create_task(submit(b, [item(i, 40) for i in range(10, 14)], client="a"))
        await until(lambda: b.depth == 4)
        other = asyncio.create_task(submit(b, [item(20, 4)], client="b"))
        await until(lambda: b.depth == 5)
        m.gate.set()
        await asyncio.gather(running, large, other)

    _, model, _ = run(body, model, max_batch_size=64, max_batch_tokens=80, max_pending_tokens=1000)
    # 80 tokens a batch: two of the large request's 40-token items, or one and the newcomer's item
    assert model.batches == [[1], [10, 20], [11, 12], [13]]


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread nice values are a POSIX/Linux feature")
def test_inference_runs_below_the_event_loops_priority_by_the_setting() -> None:
    seen: list[tuple[int, int]] = []

    class Recording(FakeModel):
        def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: object = None) -> np.ndarray:
            seen.append((threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
            return super().row_logits(rows)

    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        await submit(b, [item(1)])

    run(body, Recording(), inference_nice=3)
    (thread, nice), *_ = seen
    assert thread != threading.get_native_id()  # inference ran off the event loop's thread
    assert nice == min(19, loop_nice + 3)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop_nice  # the loop's own is kept
    seen.clear()
    run(body, Recording(), inference_nice=0)
    assert seen[0][1] == loop_nice


class TwoWorkers(WindowedModel):
    """Two inference workers: each call records its worker (``on``: idents per worker). A call holding
    ``hold_ident`` waits for ``resume``; a borrowed call (one with a cancel token) holding ``borrow_ident``
    waits until its token is set and then raises, as onnxruntime does for a terminated run."""

    workers = parallel = 2

    def __init__(self) -> None:
        super().__init__()
        self.on: dict[int, list[int]] = {0: [], 1: []}
        self.borrow_ident: int | None = None
        self.borrowed = threading.Event()

    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: Any = None) -> np.ndarray:
        idents = [e.input_ids[1] if len(e) >= 3 else e.input_ids[0] for e in rows]
        if cancel is not None and self.borrow_ident in idents:
            self.borrowed.set()
            deadline = time.monotonic() + GUARD_S
            while not cancel.terminate:
                assert time.monotonic() < deadline
                time.sleep(0.001)
            raise RuntimeError("Exiting due to terminate flag being set to true")
        out = super().row_logits(rows, worker, cancel)
        self.on[worker].append(idents[0] if len(idents) == 1 else idents)  # type: ignore[arg-type]
        return out


def test_a_short_request_runs_on_the_second_worker_beside_a_long_one() -> None:
    """With two workers, a client's long request holds one of them; another client's short request runs on
    the other and is answered while the long one's batch is still running."""
    model = TwoWorkers()
    model.hold_ident = 1  # worker 0 holds the long request's first window

    async def body(b: MicroBatcher, m: TwoWorkers, o: RecordingObserver) -> None:
        long = asyncio.create_task(submit(b, [Example(utterance="1:10:3")], client="a"))
        await asyncio.to_thread(m.held.wait, GUARD_S)
        short = await submit(b, [Example(utterance="7:10:1")], client="b")
        assert short[0].score == 0.007 and not long.done()  # answered while the long request's batch is held
        m.resume.set()
        assert [p.score for p in await long] == [0.012]  # all its windows scored, on whichever worker

    _, model, _ = run(body, model, max_batch_tokens=10)
    assert 7 in model.on[1] and model.on[0][0] == 1


def test_an_idle_worker_borrows_a_busy_clients_rows_and_gives_them_back_when_another_client_comes() -> None:
    """Alone, a client's rows fill both workers (the second as a borrowed batch); when another client's rows
    arrive and no worker is free, the borrowed batch is stopped, its rows go back unscored, the newcomer runs,
    and the long request is still answered from all its rows."""
    model = TwoWorkers()
    model.hold_ident = 1  # worker 0: the long request's first window, held
    model.borrow_ident = 11  # worker 1 borrows the second window and runs until stopped

    async def body(b: MicroBatcher, m: TwoWorkers, o: RecordingObserver) -> None:
        long = asyncio.create_task(submit(b, [Example(utterance="1:10:3")], client="a"))
        await asyncio.to_thread(m.held.wait, GUARD_S)
        await asyncio.to_thread(m.borrowed.wait, GUARD_S)
        m.borrow_ident = None  # the second time, window 11 runs
        short = await submit(b, [Example(utterance="7:10:1")], client="b")
        assert short[0].score == 0.007 and not long.done()
        m.resume.set()
        assert [p.score for p in await long] == [0.012]
        assert o.failures == 0

    _, model, observer = run(body, model, max_batch_tokens=10)
    ran = sorted(i for rows in model.on.values() for i in rows)  # type: ignore[type-var]
    assert ran == [1, 7, 11, 12]  # every row once: the stopped window again, nothing lost or doubled
    assert observer.waits == 2  # one queue wait per item


def test_an_item_whose_first_row_was_given_back_counts_its_queue_wait_once() -> None:
    """A borrowed batch holding an item's first row is stopped and the row runs again later: the item's wait
    in the queue is observed once, when its first row was first handed out, not again when it is retried."""
    model = TwoWorkers()
    model.hold_ident = 1  # worker 0: the first item of a's request, held
    model.borrow_ident = 11  # worker 1 borrows the second item's only row and runs until stopped

    async def body(b: MicroBatcher, m: TwoWorkers, o: RecordingObserver) -> None:
        pair = asyncio.create_task(submit(b, [Example(utterance="1:10:1"), Example(utterance="11:10:1")], client="a"))
        await asyncio.to_thread(m.held.wait, GUARD_S)
        await asyncio.to_thread(m.borrowed.wait, GUARD_S)
        m.borrow_ident = None
        short = await submit(b, [Example(utterance="7:10:1")], client="b")
        assert short[0].score == 0.007
        m.resume.set()
        assert [p.score for p in await pair] == [0.001, 0.011]

    _, model, observer = run(body, model, max_batch_tokens=10)
    assert sorted(i for rows in model.on.values() for i in rows) == [1, 7, 11]  # type: ignore[type-var]
    assert observer.waits == 3  # three items, each counted once (11's retry is not a second wait)


def test_the_queue_passes_over_busy_clients_and_lends_their_rows_only_when_nobody_else_waits() -> None:
    """The row queue, for one worker: the clients with rows in flight on another worker wait while any other
    client's rows do; when only theirs are left, they make a borrowed batch; rows put back go first again."""
    from dialogue_safety.service.batch_queue import BatchQueue, Pending

    async def main() -> None:
        loop = asyncio.get_running_loop()
        model = WindowedModel()
        queue = BatchQueue(lambda n: None)
        gate = AdmissionGate(10_000, 10_000)

        def put(utterance: str, client: str) -> Pending:
            (enc,) = model.encode([Example(utterance=utterance)])
            pending = Pending(enc, loop.create_future(), 0.0, gate.admit(client, CLASSIFY, enc.tokens))
            queue.put(pending)
            return pending

        put("1:10:3", "a")
        put("2:10:2", "c")

        async def take(busy: set[str]) -> tuple[list[int], bool]:
            rows, borrowed = await queue.next_batch(8, 0.0, lambda rows: None, 20, lambda: busy)
            return [row.encoded.input_ids[1] for row in rows], borrowed

        assert await take({"a"}) == ([2, 21], False)  # a is busy elsewhere: c's rows
        rows, borrowed = await queue.next_batch(8, 0.0, lambda rows: None, 20, lambda: {"a"})
        assert [r.encoded.input_ids[1] for r in rows] == [1, 11] and borrowed  # only a's rows wait: lent
        queue.put_back(rows)  # stopped for a newcomer: back, first in a's turn
        put("3:10:1", "d")
        assert await take({"a"}) == ([3], False)
        assert await take(set()) == ([1, 11], False)
        assert await take(set()) == ([12], False) and not len(queue)

    asyncio.run(main())


@pytest.mark.parametrize("parallel", [2, 1])
def test_a_lone_requests_rows_are_shared_out_between_the_free_workers_with_cores_of_their_own(parallel: int) -> None:
    """Both workers free and on cores of their own: a lone request's two rows run one on each, side by side;
    sharing one core (``parallel`` 1), one worker runs both. Either way the answer comes from both rows."""
    model = TwoWorkers()
    model.parallel = parallel  # type: ignore[misc]

    async def body(b: MicroBatcher, m: TwoWorkers, o: RecordingObserver) -> None:
        [p] = await submit(b, [Example(utterance="1:10:2")], client="a")
        assert p.score == 0.011

    _, model, _ = run(body, model)
    if parallel == 2:
        assert len(model.on[0]) == 1 and len(model.on[1]) == 1
        assert sorted([*model.on[0], *model.on[1]]) == [1, 11]  # type: ignore[type-var]
    else:
        assert [*model.on[0], *model.on[1]] == [[1, 11]]
