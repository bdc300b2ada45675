"""MicroBatcher against a fake encode/predict: batching rules, ordering, overload, cancellation,
failures and shutdown. No model, no HTTP, no timing assertions."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.errors import NotReady
from dialogue_safety.core.schema import Example, Label, Prediction
from dialogue_safety.service.batcher import Announcement, MicroBatcher
from dialogue_safety.service.errors import InferenceFailed, Overloaded
from dialogue_safety.service.latency import BOUND_HALF_LIFE_S, MAX_SLOWNESS, SLOWNESS_WINDOW_S, LatencyEstimator
from dialogue_safety.service.settings import ServiceSettings

GUARD_S = 10.0  # only against hangs; never asserted on
SETTINGS = {"max_batch_size", "max_batch_tokens", "max_wait_s", "queue_size", "retry_after_s"}


def batcher(encode: Any, predict: Any, **kwargs: Any) -> MicroBatcher:
    """A MicroBatcher with the service's defaults (ServiceSettings), but for the settings in ``kwargs``."""
    fields = {k: kwargs.pop(k) for k in list(kwargs) if k in SETTINGS}
    wait_s = fields.pop("max_wait_s", None)
    if "queue_size" in fields:  # a batch request must fit the queue
        fields["max_batch_items"] = min(256, fields["queue_size"])
    settings = ServiceSettings(**fields)
    if wait_s is not None:  # beyond the setting's range too (GUARD_S * 10: 'never' in these tests)
        settings = settings.model_copy(update={"max_wait_ms": wait_s * 1000})
    return MicroBatcher(encode, predict, settings, **kwargs)


def item(ident: int, n_tokens: int = 4) -> Example:
    """An example whose encoding carries ``ident`` and has ``n_tokens`` tokens."""
    return Example(utterance=f"{ident}:{n_tokens}")


class FakeModel:
    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()  # predict waits for it: clear() to hold batches, set() to release
        self.gate.set()
        self.entered = threading.Event()
        self.fail_ident: int | None = None

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        out = []
        for ex in examples:
            ident, n = (int(x) for x in ex.utterance.split(":"))
            ids = (101, ident, *([5] * (n - 3)), 102)[:n] if n >= 3 else (ident,) * n
            out.append(EncodedExample(ids, (0,) * len(ids), (1,) * len(ids)))
        return out

    def predict(self, encoded: list[EncodedExample]) -> list[Prediction]:
        self.entered.set()
        assert self.gate.wait(GUARD_S)
        idents = [e.input_ids[1] if len(e) >= 3 else e.input_ids[0] for e in encoded]
        if self.fail_ident is not None and self.fail_ident in idents:
            raise RuntimeError("boom")
        self.batches.append(idents)
        return [Prediction(score=i / 1000, label=Label.SAFE, threshold=0.5) for i in idents]


class RecordingObserver:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int]] = []
        self.dropped = 0
        self.failures = 0
        self.tokenizations = 0
        self.depths: list[int] = []
        self.waits = 0
        self.shed = 0
        self.bounds: list[float] = []

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

    def observe_shed(self, n: int) -> None:
        self.shed += n

    def observe_latency_bound(self, seconds: float) -> None:
        self.bounds.append(seconds)


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

    Small submissions are encoded inline here (``inline_encode_items=8``) so that the scenarios
    control exactly when items reach the queue; the service's default (0: always in a helper
    thread) is tested on its own."""
    kwargs.setdefault("inline_encode_items", 8)
    model = model or FakeModel()
    observer = RecordingObserver()

    async def main() -> Any:
        b = batcher(model.encode, model.predict, observer=observer, **kwargs)
        await b.start()
        try:
            return await asyncio.wait_for(coro_fn(b, model, observer), GUARD_S)
        finally:
            await b.stop()

    return asyncio.run(main()), model, observer


async def finished(b: MicroBatcher) -> None:
    """Until the running batch has finished its bookkeeping (speed estimates, metrics)."""
    await until(lambda: not b._running_batch)


async def wait_entered(model: FakeModel) -> None:
    """Until the inference thread is inside predict (bounded)."""
    await asyncio.to_thread(model.entered.wait, GUARD_S)


def test_single_submission_and_order() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        one = await b.submit([item(7)])
        many = await b.submit([item(i) for i in (3, 1, 2)])
        return [p.score for p in one + many]

    scores, model, obs = run(body)
    assert scores == [0.007, 0.003, 0.001, 0.002]
    assert model.batches == [[7], [3, 1, 2]]
    assert obs.tokenizations == 2 and obs.waits == 4


def test_concurrent_submissions_share_a_batch_and_results_go_to_their_callers() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[list[float]]:
        first = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)  # batch [1] is running; the rest queue up behind it
        others = [asyncio.create_task(b.submit([item(i), item(i + 100)])) for i in (2, 3, 4)]
        await asyncio.sleep(0)
        m.gate.set()
        return [[p.score for p in r] for r in await asyncio.gather(first, *others)]

    results, model, obs = run(body, model, max_batch_size=64)
    assert results == [[0.001], [0.002, 0.102], [0.003, 0.103], [0.004, 0.104]]
    assert model.batches == [[1], [2, 102, 3, 103, 4, 104]]
    assert [size for size, _ in obs.batches] == [1, 6]


def test_batches_close_at_max_batch_size() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[Prediction]:
        return await b.submit([item(i) for i in range(10)])

    preds, model, _ = run(body, max_batch_size=4)
    assert [p.score for p in preds] == [i / 1000 for i in range(10)]
    assert model.batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_batch_runs_in_length_sorted_calls_under_the_token_budget_padded_to_the_longest() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[Prediction]:
        # one batch of six, sorted longest first: 60 alone exceeds the budget and still runs (alone);
        # 30 with a 10 would make 2 x 30 = 60 > 50; the four 10s make 40 <= 50
        return await b.submit([item(1, 10), item(2, 10), item(3, 30), item(4, 10), item(5, 60), item(6, 10)])

    preds, model, obs = run(body, max_batch_tokens=50)
    assert [p.score for p in preds] == [0.001, 0.002, 0.003, 0.004, 0.005, 0.006]  # the caller's order
    assert model.batches == [[5], [3], [1, 2, 4, 6]]
    assert obs.batches == [(1, 60), (1, 30), (4, 40)]


def test_lone_request_does_not_wait_but_concurrent_traffic_waits_for_company() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        # A lone request with a huge max_wait comes back at once (the guard would fail otherwise).
        await asyncio.wait_for(b.submit([item(1)]), GUARD_S / 2)
        # After a batch of several items the batcher expects company: a request that arrives a
        # few loop turns after another joins its batch (closed by size, not by the deadline).
        await b.submit([item(2), item(3)])
        first = asyncio.create_task(b.submit([item(4)]))
        for _ in range(5):
            await asyncio.sleep(0)
        second = asyncio.create_task(b.submit([item(5)]))
        await asyncio.gather(first, second)

    _, model, _ = run(body, max_batch_size=2, max_wait_s=GUARD_S * 10)
    assert model.batches == [[1], [2, 3], [4, 5]]


def test_full_queue_raises_overloaded_and_then_recovers() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)
        queued = asyncio.create_task(b.submit([item(2), item(3)]))
        await until(lambda: b.depth == 2)  # encoding runs in a helper thread
        with pytest.raises(Overloaded):
            await b.submit([item(5), item(6)])  # all-or-nothing: nothing of it is queued
        assert b.depth == 2
        last = asyncio.create_task(b.submit([item(4)]))
        await until(lambda: b.depth == 3)
        with pytest.raises(Overloaded) as too_many:
            await b.submit([item(5)])
        assert too_many.value.headers["Retry-After"] == "1"
        m.gate.set()
        await asyncio.gather(running, queued, last)
        return [p.score for p in await b.submit([item(7), item(8), item(9)])]

    scores, model, _ = run(body, model, queue_size=3)
    assert scores == [0.007, 0.008, 0.009]
    assert model.batches[:2] == [[1], [2, 3, 4]] and 5 not in sum(model.batches, [])


def test_cancelled_requests_are_dropped_before_inference() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)
        gone = asyncio.create_task(b.submit([item(2), item(3)]))
        stays = asyncio.create_task(b.submit([item(4)]))
        gone_single = asyncio.create_task(b.submit([item(5)]))
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
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)
        futures = await b.enqueue([item(2), item(3)])
        b.release(futures)  # the HTTP client disconnected
        m.gate.set()
        await running
        await b.submit([item(4)])

    _, model, obs = run(body, model)
    assert model.batches == [[1], [4]]
    assert obs.dropped == 2


def test_a_failing_batch_fails_only_its_requests_and_the_batcher_keeps_serving() -> None:
    model = FakeModel()
    model.gate.clear()
    model.fail_ident = 3

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[object]:
        before = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)
        doomed = [asyncio.create_task(b.submit([item(i)])) for i in (2, 3)]  # one batch: [2, 3]
        await asyncio.sleep(0)
        m.gate.set()
        results = await asyncio.gather(before, *doomed, return_exceptions=True)
        after = await b.submit([item(4), item(5)])
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
        b = batcher(model.encode, model.predict, inline_encode_items=8)
        with pytest.raises(NotReady):
            await b.submit([item(0)])  # not started
        await b.start()
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(model)
        queued = asyncio.create_task(b.submit([item(2), item(3)]))
        await asyncio.sleep(0)
        await b.stop()
        model.gate.set()
        for task in (running, queued):
            with pytest.raises(NotReady) as info:
                await asyncio.wait_for(task, GUARD_S)
            assert info.value.code == "shutting_down"
        with pytest.raises(NotReady):
            await b.submit([item(4)])

    asyncio.run(main())


def test_large_submissions_are_encoded_off_the_loop_with_the_same_results() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        return [p.score for p in await b.submit([item(i) for i in range(40)])]

    scores, _, _ = run(body, inline_encode_items=4)
    assert scores == [i / 1000 for i in range(40)]


def test_invalid_configuration_is_refused() -> None:
    model = FakeModel()
    with pytest.raises(ValueError):
        batcher(model.encode, model.predict, max_batch_size=0)


def test_stop_while_a_batch_waits_for_company_fails_its_items() -> None:
    model = FakeModel()

    async def main() -> None:
        b = batcher(model.encode, model.predict, max_batch_size=8, max_wait_s=GUARD_S * 10, inline_encode_items=8)
        await b.start()
        await b.submit([item(1), item(2)])  # concurrent traffic: the next batch waits for company
        waiting = asyncio.create_task(b.submit([item(3)]))
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
        b = batcher(model.encode, model.predict, max_batch_size=2)
        await b.start()
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(model)
        queued = asyncio.create_task(b.submit([item(2), item(3), item(4)]))
        await asyncio.sleep(0)
        draining = asyncio.create_task(b.drain(GUARD_S))
        await asyncio.sleep(0)
        with pytest.raises(NotReady):
            await b.submit([item(5)])  # new work goes elsewhere (the hot swap's new batcher)
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
        b = batcher(slow_encode, model.predict)  # the default: encoded in the helper thread
        await b.start()
        in_flight = asyncio.create_task(b.submit([item(1)]))
        await asyncio.to_thread(encoding.wait, GUARD_S)
        draining = asyncio.create_task(b.drain(GUARD_S))
        await asyncio.sleep(0)
        with pytest.raises(NotReady):
            await b.submit([item(2)])  # new work is refused before encoding
        assert not draining.done()
        release.set()
        assert await asyncio.wait_for(draining, GUARD_S) is True
        assert [p.score for p in await in_flight] == [0.001]  # admitted before the drain: served here

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
        b = batcher(slow_encode, model.predict)
        await b.start()
        in_thread = asyncio.create_task(b.submit([item(1)]))
        await asyncio.to_thread(encoding.wait, GUARD_S)
        waiting = asyncio.create_task(b.submit([item(2)]))  # waits for the busy encoding thread
        await asyncio.sleep(0)
        await b.stop()
        release.set()
        return list(await asyncio.wait_for(asyncio.gather(in_thread, waiting, return_exceptions=True), GUARD_S))

    results = asyncio.run(main())
    assert all(isinstance(r, NotReady) and r.code == "shutting_down" for r in results), results


def test_drain_gives_up_after_its_timeout_and_fails_what_is_left() -> None:
    model = FakeModel()
    model.gate.clear()

    async def main() -> None:
        b = batcher(model.encode, model.predict)
        await b.start()
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(model)
        queued = asyncio.create_task(b.submit([item(2)]))
        await asyncio.sleep(0)
        assert await b.drain(0.01) is False
        model.gate.set()
        for task in (running, queued):
            with pytest.raises(NotReady):
                await asyncio.wait_for(task, GUARD_S)

    asyncio.run(main())


def test_by_default_every_submission_is_encoded_off_the_event_loop() -> None:
    model = FakeModel()
    threads: list[str] = []
    encode = model.encode

    def recording_encode(examples: Any) -> Any:
        threads.append(threading.current_thread().name)
        return encode(examples)

    async def main() -> list[float]:
        b = batcher(recording_encode, model.predict)
        await b.start()
        try:
            return [p.score for p in await b.submit([item(1)])]
        finally:
            await b.stop()

    assert asyncio.run(main()) == [0.001]
    assert threads and all(name.startswith("safety-encode") for name in threads)


def test_a_lone_short_request_to_an_idle_batcher_is_encoded_on_the_loop_when_asked() -> None:
    """``inline_lone_chars`` (the service passes ``LONE_INLINE_CHARS``): a lone short request to an
    idle batcher is encoded on the event loop; a longer one, several items, or one arriving while a
    batch runs go to the encoding thread."""
    model = FakeModel()
    threads: list[tuple[str, str]] = []
    encode = model.encode

    def recording_encode(examples: Any) -> Any:
        threads.extend((e.utterance, threading.current_thread().name) for e in examples)
        return encode(examples)

    long_one = Example(utterance="9:4" + " " * 40)  # 43 characters: over the limit below

    async def main() -> None:
        b = batcher(recording_encode, model.predict, inline_lone_chars=20)
        await b.start()
        try:
            await b.submit([item(1)])  # idle and short: on the loop
            await finished(b)
            await b.submit([long_one])  # too long
            await finished(b)
            await b.submit([item(2), item(3)])  # not alone
            await finished(b)
            model.gate.clear()
            model.entered.clear()
            running = asyncio.create_task(b.submit([item(4)]))  # idle again: on the loop, then held
            await wait_entered(model)
            behind = asyncio.create_task(b.submit([item(5)]))  # a batch runs: the encoding thread
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
    model = FakeModel()
    calls = 0

    def predict(encoded: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise raised
        return model.predict(encoded)

    async def main() -> list[str]:
        b = batcher(model.encode, predict)
        await b.start()
        outcomes = []
        try:
            for ident in (1, 2):
                try:
                    await asyncio.wait_for(b.submit([item(ident)]), GUARD_S)
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
            b = batcher(model.encode, model.predict)
            await b.start()
            await b.submit([item(1)])
            assert b._task is not None
            b._task.cancel()  # never stopped: only dropped
            await asyncio.gather(b._task, return_exceptions=True)
            del b

    asyncio.run(main())
    gc.collect()
    deadline = time.monotonic() + GUARD_S
    while alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert alive() == 0


def test_inline_lone_chars_zero_never_encodes_on_the_loop() -> None:
    model = FakeModel()
    threads: list[str] = []

    def encode(examples: Any) -> Any:
        threads.append(threading.current_thread().name)
        return model.encode([item(1) for _ in examples])

    async def main() -> None:
        b = batcher(encode, model.predict)  # inline_lone_chars: 0
        await b.start()
        try:
            await b.submit([Example(utterance="")])  # 0 characters: still not inline
        finally:
            await b.stop()

    asyncio.run(main())
    assert threads and threads[0].startswith("safety-encode"), threads


def test_admission_refuses_what_would_wait_longer_than_max_queue_wait() -> None:
    model = FakeModel()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        await b.submit([item(1)])  # one batch measured: seconds per token known
        assert b.expected_wait_s == 0
        assert b.refusal(1) is None
        m.gate.clear()
        running = asyncio.create_task(b.submit([item(2)]))
        await wait_entered(m)
        queued = asyncio.create_task(b.submit([item(3)]))  # admitted: the measured batches were fast
        await until(lambda: b.depth == 1)
        b.estimator.seconds_per_token = 1.0  # as if each token took a second: the queue is 'slow'
        assert b.expected_wait_s is not None and b.expected_wait_s >= 4  # item 3's tokens, at least
        refusal = b.refusal(1)  # returned, for the server to answer before reading a body
        assert isinstance(refusal, Overloaded) and "SAFETY_MAX_QUEUE_WAIT_MS" in refusal.message
        with pytest.raises(Overloaded) as refused:
            await b.submit([item(4)])
        assert "SAFETY_MAX_QUEUE_WAIT_MS" in refused.value.message
        m.gate.set()
        await asyncio.gather(running, queued)

    run(body, model, max_queue_wait_s=0.5)


def test_the_running_batch_counts_in_the_expected_wait() -> None:
    model = FakeModel()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        await b.submit([item(1)])
        m.gate.clear()
        running = asyncio.create_task(b.submit([item(2)]))
        await wait_entered(m)
        assert b.depth == 0
        b.estimator.seconds_per_token = 1.0  # the batch now running would take seconds: nothing queued, still too long
        assert b.expected_wait_s is not None and b.expected_wait_s > 0.5
        with pytest.raises(Overloaded):
            await b.submit([item(3)])
        m.gate.set()
        await running

    run(body, model, max_queue_wait_s=0.5)


def test_announced_requests_count_until_queued_and_their_wait_counts_from_the_head() -> None:
    model = FakeModel()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        await b.submit([item(1)])
        # 0.2 s an item; no encoding time, no headroom: the arithmetic stays exact on a busy machine
        b.estimator.seconds_per_token, b.estimator.item_tokens, b.estimator.encode_seconds_per_item = 0.05, 4.0, 0.0
        b.estimator.last_batch_s = 0.0
        announced = [b.announce() for _ in range(3)]  # 0, 0.2 and 0.4 s of work ahead of them
        assert all(isinstance(a, Announcement) for a in announced)
        assert b.expected_wait_s == pytest.approx(0.6)  # counted before their bodies are read
        assert isinstance(b.announce(), Overloaded)  # 0.6 s ahead: over the 0.5 s bound
        first = announced[0]
        assert isinstance(first, Announcement)
        first.settle()
        first.settle()  # idempotent
        assert b.expected_wait_s == pytest.approx(0.4)
        await asyncio.sleep(0.55)  # the others' bodies are slow to come
        b.estimator.seconds_per_token = 0.0
        second = announced[1]
        assert isinstance(second, Announcement)
        (future,) = await b.enqueue([item(3)], second)  # queued: no longer counted as announced...
        assert b._announced == 1
        with pytest.raises(Overloaded, match="too long to be answered"):  # ...and it has waited since its head
            await future

    run(body, model, max_queue_wait_s=0.5)


def test_items_that_waited_longer_than_max_queue_wait_are_refused_not_served_late() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[object]:
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)
        late = asyncio.create_task(b.submit([item(2)]))
        await until(lambda: b.depth == 1)
        await asyncio.sleep(0.08)  # longer than max_queue_wait_s while the first batch holds the thread
        m.gate.set()
        return list(await asyncio.gather(running, late, return_exceptions=True))

    results, model, obs = run(body, model, max_queue_wait_s=0.05)
    assert [p.score for p in results[0]] == [0.001]
    assert isinstance(results[1], Overloaded)
    assert obs.shed == 1 and model.batches == [[1]]


# -- the latency estimator alone: plain arithmetic, no event loop ------------------------------------
def test_the_wait_limit_leaves_room_for_this_batch_its_recent_slowness_and_the_loop() -> None:
    est = LatencyEstimator(max_batch_size=8, max_queue_wait_s=1.0)
    assert est.wait_limit_s(0.1) == 1.0  # nothing measured yet: max_queue_wait_s
    assert est.latency_bound_s is None
    est.batch_s = 0.1  # one batch: the promise is an answer within 1.0 + 0.1 s
    assert est.latency_bound_s == pytest.approx(1.1)
    assert est.wait_limit_s(0.1) == 1.0  # never more than max_queue_wait_s
    now = time.perf_counter()
    est.slowness.extend([(now, 1.2), (now, 2.5), (now, 0.8)])  # the worst recent batch took 2.5x its prediction
    est.loop_lag.append(0.05)
    assert est.wait_limit_s(0.1) == pytest.approx(1.1 - 0.25 - 0.05)
    assert est.wait_limit_s(10.0) == 0.5  # at least half: fresh items always run


def test_a_bound_derived_from_the_machine_follows_the_speed_batches_run_at_never_under_warm_up() -> None:
    from dialogue_safety.service.latency import QUEUE_WAIT_BATCHES

    derived = LatencyEstimator(max_batch_size=8, max_queue_wait_s=1.0, follow_machine=True)
    derived.learn_batch(items=8, padded=100, elapsed=0.2, predicted=None)  # as fast as warm-up said: unchanged
    assert derived.max_queue_wait_s == 1.0
    for _ in range(30):  # under load a full batch takes 0.5 s: the bound becomes three of them
        derived.learn_batch(items=8, padded=100, elapsed=0.5, predicted=None)
    assert derived.max_queue_wait_s == pytest.approx(QUEUE_WAIT_BATCHES * 0.5, rel=0.01)
    derived.learn_batch(items=4, padded=50, elapsed=0.25, predicted=None)  # half full: scaled to a full batch
    assert derived.full_batch_s == pytest.approx(0.5, rel=0.01)
    assert derived.latency_bound_s == pytest.approx(derived.max_queue_wait_s + derived.batch_s)
    for _ in range(60):  # the load goes: back to the warm-up's bound, not under it
        derived.learn_batch(items=8, padded=100, elapsed=0.05, predicted=None)
    assert derived.max_queue_wait_s == 1.0
    before = derived.full_batch_s
    derived.learn_batch(items=8, padded=100, elapsed=30.0, predicted=0.05)  # a stall: not a measure of speed
    assert derived.full_batch_s == before and derived.max_queue_wait_s == 1.0
    for _ in range(30):  # a very slow machine: at most MAX_SLOWNESS times the warm-up's bound
        derived.learn_batch(items=8, padded=100, elapsed=5.0, predicted=None)
    assert derived.max_queue_wait_s == pytest.approx(MAX_SLOWNESS * 1.0)
    derived.full_batch_at -= SLOWNESS_WINDOW_S + BOUND_HALF_LIFE_S  # no load since: the excess halves ...
    assert derived.max_queue_wait_s == pytest.approx(1.0 + (MAX_SLOWNESS - 1.0) / 2, rel=0.01)
    derived.full_batch_at -= 20 * BOUND_HALF_LIFE_S  # ... and halves again: back to the warm-up's bound
    assert derived.max_queue_wait_s == pytest.approx(1.0, abs=1e-5)
    fixed = LatencyEstimator(max_batch_size=8, max_queue_wait_s=1.0)  # SAFETY_MAX_QUEUE_WAIT_MS: never moves
    for _ in range(30):
        fixed.learn_batch(items=8, padded=100, elapsed=0.5, predicted=None)
    assert fixed.max_queue_wait_s == 1.0


def test_a_stall_is_forgotten_and_the_slowness_factor_is_capped() -> None:
    est = LatencyEstimator(max_batch_size=8, max_queue_wait_s=1.0)
    now = time.perf_counter()
    est.slowness.append((now - SLOWNESS_WINDOW_S - 1, 45.0))  # one stalled batch, a while ago
    assert est.slowness_factor() == 1.0  # light traffic since: no half-full batch replaced it
    est.slowness.append((now, 45.0))
    assert est.slowness_factor() == MAX_SLOWNESS


def test_the_estimator_learns_one_batch_from_half_full_batches_only_and_weighs_speed_by_fullness() -> None:
    est = LatencyEstimator(max_batch_size=8, max_queue_wait_s=1.0)
    assert est.expected_wait_s(100) is None  # nothing measured: no estimate, nothing refused
    assert not est.learn_batch(items=1, padded=10, elapsed=0.1, predicted=None)  # a lone item: not "one batch"
    assert est.seconds_per_token == pytest.approx(0.01) and est.batch_s is None
    assert est.learn_batch(items=8, padded=100, elapsed=0.2, predicted=0.1)  # full: 0.002 s/token, weight 0.2
    assert est.seconds_per_token == pytest.approx(0.8 * 0.01 + 0.2 * 0.002)
    assert est.batch_s == pytest.approx(0.2) and est.latency_bound_s == pytest.approx(1.2)
    assert est.slowness_factor() == pytest.approx(2.0)  # it took twice its prediction
    spt = est.seconds_per_token
    est.item_tokens, est.encode_seconds_per_item = 10.0, 0.001
    assert est.expected_wait_s(queued_tokens=50, to_encode=2) == pytest.approx(2 * 0.001 + (50 + 20) * spt)
    est.started(padded=100)  # a batch running now counts with what is left of it
    assert est.expected_wait_s(queued_tokens=50) > 50 * spt
    est.ended()
    assert est.expected_wait_s(queued_tokens=50) == pytest.approx(50 * spt)


def test_the_estimator_refuses_when_the_queued_work_and_one_batch_would_pass_the_limit() -> None:
    est = LatencyEstimator(max_batch_size=8, max_queue_wait_s=1.0)
    est.learn_batch(items=8, padded=100, elapsed=0.2, predicted=None)  # one batch: 0.2 s
    assert est.refusal(0.7, retry_after_s=1) is None  # 0.7 + 0.2 of headroom <= 1.0
    refused = est.refusal(0.9, retry_after_s=3)
    assert isinstance(refused, Overloaded) and refused.headers == {"Retry-After": "3"}
    assert "SAFETY_MAX_QUEUE_WAIT_MS (1000 ms)" in refused.message
    # a submission of three batches: each item's own batches ahead of it are not held against it
    assert est.own_waits([(8, 100), (8, 100), (2, 20)]) == [0.0] * 8 + [0.2] * 8 + [0.4] * 2
    assert est.own_waits([(5, 60)]) == [0.0] * 5


def test_an_item_that_could_not_be_answered_within_the_bound_is_refused_before_its_batch() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[object]:
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)
        old = asyncio.create_task(b.submit([item(2)]))
        await until(lambda: b.depth == 1)
        # measured: one batch 0.1 s, batches lately up to 3x slower than predicted; this batch: ~0.1 s
        b.estimator.batch_s, b.estimator.seconds_per_token = 0.1, 0.1 / 8
        b.estimator.slowness.append((time.perf_counter(), 3.0))
        await asyncio.sleep(0.9)  # waited 0.9 s: under max_queue_wait_s (1 s), but 0.9 + 3 x 0.1 > 1.1 s
        fresh = asyncio.create_task(b.submit([item(3)]))
        await until(lambda: b.depth == 2)
        m.gate.set()
        return list(await asyncio.gather(running, old, fresh, return_exceptions=True))

    results, model, obs = run(body, model, max_queue_wait_s=1.0)
    assert isinstance(results[1], Overloaded) and "too long to be answered" in str(results[1])
    assert [p.score for p in results[2]] == [0.003]  # type: ignore[union-attr]
    assert obs.shed == 1 and model.batches == [[1], [3]]


def test_a_request_of_several_batches_is_not_refused_for_waiting_on_its_own_first_batches() -> None:
    model = FakeModel()
    predict = model.predict

    def slow_predict(encoded: list[EncodedExample]) -> list[Prediction]:
        time.sleep(0.1)  # 0.1 s a batch of two
        return predict(encoded)

    model.predict = slow_predict  # type: ignore[method-assign]

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[float]:
        await b.submit([item(1), item(2)])  # one full batch measured: ~0.1 s, the bound ~0.25 s
        await finished(b)
        # six items: three batches of two, the last starting ~0.2 s after the request's head (over
        # max_queue_wait_s) only because of the request's own first batches: an idle service serves it
        return [p.score for p in await b.submit([item(i) for i in range(10, 16)])]

    scores, model, obs = run(body, model, max_batch_size=2, max_queue_wait_s=0.15)
    assert scores == [0.010, 0.011, 0.012, 0.013, 0.014, 0.015]
    assert obs.shed == 0 and len(model.batches) == 4


def test_one_batch_longer_than_the_wait_bound_does_not_refuse_the_requests_after_it() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        await b.submit([item(1)])
        # a maximal batch request ran 2 s against a 0.5 s bound; the batcher is idle again
        b.estimator.batch_s = b.estimator.last_batch_s = 2.0
        b.estimator.seconds_per_token = 0.001
        assert b.refusal(1) is None  # nothing ahead: admitted (it used to be refused for ever)
        assert [p.score for p in await b.submit([item(2)])] == [0.002]

    run(body, max_queue_wait_s=0.5)


def test_queue_depth_gauge_drops_when_waiting_callers_leave() -> None:
    model = FakeModel()
    model.gate.clear()

    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> None:
        running = asyncio.create_task(b.submit([item(1)]))
        await wait_entered(m)
        futures = await b.enqueue([item(2), item(3)])
        assert o.depths[-1] == 2
        b.release(futures)
        assert o.depths[-1] == 0  # not stuck at 2 until the next batch forms
        m.gate.set()
        await running

    run(body, model)


def test_concurrent_submissions_are_encoded_together_and_a_failing_one_is_isolated() -> None:
    model = FakeModel()
    calls: list[int] = []
    encode = model.encode

    def counting_encode(examples: Any) -> Any:
        calls.append(len(examples))
        if any(ex.utterance == "poison" for ex in examples):
            raise ValueError("cannot encode this one")
        return encode(examples)

    async def main() -> list[object]:
        b = batcher(counting_encode, model.predict)
        await b.start()
        try:
            subs = [b.submit([item(i)]) for i in range(1, 9)]
            subs.append(b.submit([Example(utterance="poison")]))
            return list(await asyncio.gather(*subs, return_exceptions=True))
        finally:
            await b.stop()

    results = asyncio.run(main())
    assert [p[0].score for p in results[:8]] == [i / 1000 for i in range(1, 9)]  # type: ignore[index]
    assert isinstance(results[8], ValueError)
    assert max(calls) > 1  # at least one round encoded several submissions in one call


def test_padded_tokens_count_the_second_pass_of_a_decomposed_model() -> None:
    from dialogue_safety.core.encoding import EncodedExample
    from dialogue_safety.service.batcher import _padded

    def row(n: int, alone: int | None = None) -> EncodedExample:
        extra = EncodedExample((1,) * alone, (0,) * alone) if alone else None
        return EncodedExample((1,) * n, (0,) * n, (1,) * n, extra)

    encoded = [row(10, 4), row(6), row(8, 7)]
    # one call: 3 x 10 dialogue tokens, then 2 x 7 for the utterances alone
    assert _padded(encoded, [[0, 1, 2]]) == 30 + 14
    assert _padded(encoded, [[0], [1, 2]]) == (10 + 4) + (2 * 8 + 7)


class WindowedModel(FakeModel):
    """``"ident:n:w"``: an item of ``w`` windows of ``n`` tokens (a long utterance)."""

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        out = []
        for ex in examples:
            ident, n, windows = (int(x) for x in ex.utterance.split(":"))
            (row,) = super().encode([Example(utterance=f"{ident}:{n}")])
            out.append(dataclasses.replace(row, more=(row,) * (windows - 1)))
        return out


def test_the_token_budget_counts_every_window_of_a_long_utterance() -> None:
    async def body(b: MicroBatcher, m: FakeModel, o: RecordingObserver) -> list[Prediction]:
        return await b.submit([Example(utterance="1:10:3"), Example(utterance="2:10:1"), Example(utterance="3:10:1")])

    # 3 windows of 10 + 1 row of 10 = 40 padded tokens fit a budget of 40; the third item goes on
    _, model, obs = run(body, WindowedModel(), max_batch_tokens=40)
    assert model.batches == [[1, 2], [3]]
    assert obs.batches == [(2, 40), (1, 10)]
    # counted as items (what the budget was before windows), all three would have fitted in one call
    _, model, obs = run(body, WindowedModel(), max_batch_tokens=30)
    assert model.batches == [[1], [2, 3]] and obs.batches == [(1, 30), (2, 20)]


def test_a_followed_bound_admits_two_batches_ahead_when_batches_run_late() -> None:
    """64 closed-loop clients and batches of 64: an item can have the running batch and a full one ahead of it.
    Batches that run 1.3x their prediction (the admission charges that slowness) must not get it refused."""
    from dialogue_safety.service.latency import QUEUE_WAIT_BATCHES

    def loaded(follow: bool) -> LatencyEstimator:
        est = LatencyEstimator(max_batch_size=64, max_queue_wait_s=1.5, follow_machine=follow)
        for _ in range(40):  # under load a full batch of 2,560 tokens takes 0.8 s, predicted 0.8 / 1.3
            est.learn_batch(items=64, padded=2560, elapsed=0.8, predicted=0.8 / 1.3, lag=0.02)
        return est

    followed, fixed = loaded(True), loaded(False)
    assert followed.slowness_factor() == pytest.approx(1.3)
    assert followed.max_queue_wait_s == pytest.approx(QUEUE_WAIT_BATCHES * 0.8 * 1.3 + 0.02, rel=0.01)
    ahead = followed.predict_s(2 * 2560)  # two full batches at the measured speed
    assert ahead is not None
    assert followed.refusal(ahead, retry_after_s=1) is None
    fixed_ahead = fixed.predict_s(2 * 2560)  # the same machine with the bound fixed at three warm-up batches
    assert fixed_ahead is not None and fixed.refusal(fixed_ahead, retry_after_s=1) is not None


def test_a_stall_does_not_move_the_followed_bound_and_no_load_decays_it_from_where_it_stood() -> None:
    from dialogue_safety.service.latency import QUEUE_WAIT_BATCHES

    est = LatencyEstimator(max_batch_size=64, max_queue_wait_s=1.5, follow_machine=True)
    for _ in range(40):  # batches of 0.8 s that run 1.3x their prediction
        est.learn_batch(items=64, padded=2560, elapsed=0.8, predicted=0.8 / 1.3, lag=0.02)
    loaded = est.max_queue_wait_s
    assert loaded == pytest.approx(QUEUE_WAIT_BATCHES * 0.8 * 1.3 + 0.02, rel=0.01)
    est.learn_batch(items=64, padded=2560, elapsed=30.0, predicted=0.8)  # a stall: 37x its prediction
    assert est.max_queue_wait_s == pytest.approx(loaded, rel=0.01)  # neither its time nor its slowness count
    assert est.slowness_factor() == MAX_SLOWNESS  # dispatch still allows for it
    est.full_batch_at -= SLOWNESS_WINDOW_S + 0.01  # the load ended: the decay starts from the bound as it stood
    assert est.max_queue_wait_s == pytest.approx(loaded, rel=0.01)
    est.full_batch_at -= BOUND_HALF_LIFE_S
    assert est.max_queue_wait_s == pytest.approx(1.5 + (loaded - 1.5) / 2, rel=0.01)


def test_the_default_queue_wait_is_three_full_batches_at_least_one_second() -> None:
    from dialogue_safety.service.latency import default_queue_wait_s

    assert default_queue_wait_s(None) == 1.0  # not measured: the old fixed default
    assert default_queue_wait_s(0.1) == 1.0  # a fast machine: unchanged
    assert default_queue_wait_s(0.5) == pytest.approx(1.5)  # one batch of 64 = 0.5 s: three of them


def test_a_full_batch_is_timed_in_the_calls_the_batcher_makes() -> None:
    from dialogue_safety.service.latency import measure_full_batch_s, typical_example

    calls: list[int] = []
    model = FakeModel()

    def encode(examples: Sequence[Example]) -> list[EncodedExample]:
        assert all(e == typical_example() for e in examples)
        return model.encode([item(i, 40) for i in range(len(examples))])

    def predict(encoded: list[EncodedExample]) -> list[Prediction]:
        calls.append(len(encoded))
        time.sleep(0.01)
        return model.predict(encoded)

    took = measure_full_batch_s(encode, predict, max_batch_size=16, max_batch_tokens=160, rounds=2)
    assert calls == [4, 4, 4, 4] * 2  # 16 items of 40 tokens in calls of 160 padded tokens, twice
    assert 0.04 <= took < 1.0  # the faster round: four calls of 10 ms


def test_one_max_batch_size_default() -> None:
    """The service's setting, the runtime's and torch inference's default are one constant (were 64, 256, 256)."""
    import inspect

    from dialogue_safety.core.batch_budget import MAX_BATCH_SIZE
    from dialogue_safety.core.runtime import OnnxClassifier

    assert ServiceSettings.model_fields["max_batch_size"].default == MAX_BATCH_SIZE
    assert inspect.signature(OnnxClassifier).parameters["max_batch_size"].default == MAX_BATCH_SIZE
    assert "max_batch_size" not in inspect.signature(MicroBatcher).parameters  # the batcher repeats no default
