"""The micro-batcher schedules rows, with the real ONNX runtime (the tiny exported models, no fakes): a long
request's windows are spread over batches with another client's rows between them, and every request's
verdict is the one the runtime gives it scored alone or with all its rows together (batch = single)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from service_conftest import decomposed_model_dir, submit, tiny_model_dir  # noqa: F401  (fixtures)

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.runtime import OnnxClassifier, physical_cores
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.service.batcher import MicroBatcher
from dialogue_safety.service.settings import ServiceSettings

GUARD_S = 60.0  # only against hangs; never asserted on
INSULT = "you are a very stupid idiot and i hate you because you are"
LONG = " ".join([INSULT] * 30)  # ~390 tokens: several windows
HISTORY = ["what do you think of my essay?", " ".join(["it was a long essay about the history of the town"] * 8)]
LONG_REQUESTS = [Example.from_texts(LONG, HISTORY), Example(utterance=LONG)]
SHORT_REQUESTS = [
    Example.from_texts("thanks, that was helpful", ["can you help me?", "sure"]),
    Example(utterance="ok"),
    Example.from_texts("i agree", ["women are worse drivers"]),
    Example.from_texts("shut up", ["hello"]),
]


class Recording:
    """The classifier as the batcher sees it, recording which request each row of each call belongs to."""

    def __init__(self, clf: OnnxClassifier) -> None:
        self.clf = clf
        self.workers = clf.workers
        self.parallel = clf.parallel
        self.cancel_token = clf.cancel_token
        self.owner: dict[int, str] = {}  # id(row) -> request name
        self.calls: list[list[str]] = []

    def own(self, name: str, encoded: EncodedExample) -> None:
        for row in encoded.model_rows:
            self.owner[id(row)] = name

    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: object = None) -> np.ndarray:
        logits = self.clf.row_logits(rows, worker, cancel)  # a stopped run raises: not recorded
        self.calls.append([self.owner.get(id(row), "?") for row in rows])
        return logits

    def predict_scored(self, encoded: Sequence[EncodedExample], scored: object) -> list[Prediction]:
        return self.clf.predict_scored(encoded, scored)  # type: ignore[arg-type]


def _serve(clf: OnnxClassifier, max_batch_tokens: int) -> tuple[list[Prediction], list[Prediction], Recording]:
    """Client a sends the long requests, client b the short ones right behind (one request at a time each)."""
    recording = Recording(clf)

    def encode(examples: Sequence[Example]) -> list[EncodedExample]:
        encoded = clf.encode(examples)
        for example, e in zip(examples, encoded, strict=True):
            name = "long" if example in LONG_REQUESTS else "short"
            recording.own(name, e)
        return encoded

    async def main() -> tuple[list[Prediction], list[Prediction]]:
        settings = ServiceSettings(max_batch_tokens=max_batch_tokens, max_pending_tokens=100_000)
        b = MicroBatcher(encode, recording, settings)
        await b.start()
        try:
            long = asyncio.create_task(submit(b, LONG_REQUESTS, client="a"))
            while not b.depth:
                await asyncio.sleep(0.001)
            short = [await submit(b, [ex], client="b") for ex in SHORT_REQUESTS]
            return await asyncio.wait_for(long, GUARD_S), [p for [p] in short]
        finally:
            await b.stop()

    long, short = asyncio.run(main())
    return long, short, recording


def _same_verdict(got: Prediction, want: Prediction) -> None:
    assert got.label == want.label and got.read == want.read
    assert got.score == pytest.approx(want.score, abs=1e-5)
    assert got.categories == pytest.approx(want.categories, abs=1e-5)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("which", ["segments", "decomposed"])
def test_rows_spread_over_batches_give_the_verdict_of_the_request_scored_whole(
    which: str,
    workers: int,
    tiny_model_dir: Path,  # noqa: F811
    request: pytest.FixtureRequest,
) -> None:
    model_dir = tiny_model_dir if which == "segments" else request.getfixturevalue("decomposed_model_dir")
    clf = OnnxClassifier(model_dir, variant="fp32", workers=workers)
    encoded = clf.encode(LONG_REQUESTS)
    assert all(len(e.rows) > 1 for e in encoded)  # long: several windows each
    assert (encoded[0].alone is not None) == (which == "decomposed")  # with history: an utterance-alone row too
    together = clf.predict(LONG_REQUESTS + SHORT_REQUESTS)  # every row of every request in the runtime's calls
    width = max(len(row) for e in encoded for row in e.model_rows)

    long, short, recording = _serve(clf, max_batch_tokens=width)  # one long row a batch
    for got, example, want in zip(long + short, LONG_REQUESTS + SHORT_REQUESTS, together, strict=True):
        _same_verdict(got, want)
        (alone,) = clf.predict([example])  # the request scored alone
        _same_verdict(got, alone)
    # the long requests' rows ran in many calls, and the other client's rows ran between them
    calls_with_long = [i for i, call in enumerate(recording.calls) if "long" in call]
    calls_with_short = [i for i, call in enumerate(recording.calls) if "short" in call]
    n_long_rows = sum(len(e.model_rows) for e in encoded)
    assert len(calls_with_long) == n_long_rows  # one long row a call (a stopped borrowed run is not a call)
    if workers == 1:
        assert calls_with_short and all(calls_with_long[0] < i < calls_with_long[-1] for i in calls_with_short)
    else:  # the short rows ran on the other worker, before the long requests' last rows
        assert calls_with_short and calls_with_short[0] < calls_with_long[-1]


def test_each_worker_has_its_own_session_with_the_same_logits_and_a_set_token_stops_a_run(
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    clf = OnnxClassifier(tiny_model_dir, variant="fp32", workers=2, intra_op_threads=2)
    assert clf.workers == 2 and clf.intra_op_threads == 1  # the threads shared out
    assert clf.parallel == min(2, physical_cores())
    rows = [row for e in clf.encode(LONG_REQUESTS + SHORT_REQUESTS) for row in e.model_rows]
    np.testing.assert_allclose(clf.row_logits(rows, 1), clf.row_logits(rows, 0), atol=1e-5)
    token = clf.cancel_token()
    np.testing.assert_allclose(clf.row_logits(rows, 1, token), clf.row_logits(rows), atol=1e-5)  # not set: runs
    token.terminate = True
    with pytest.raises(Exception, match="(?i)terminate"):
        clf.row_logits(rows, 1, token)
    np.testing.assert_allclose(clf.row_logits(rows, 1), clf.row_logits(rows, 0), atol=1e-5)  # the session still serves


def test_a_session_on_a_device_is_one_worker_with_all_the_threads(
    tiny_model_dir: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked for two workers, a model placed on CUDA runs as one worker (one device), and its session gets the
    intra-op threads asked for, not one worker's share of them. onnxruntime-gpu is not installed here: the
    CUDA session is the CPU session reporting CUDA as its provider, the threads recorded as it is made."""
    import onnxruntime as ort

    cuda, cpu = "CUDAExecutionProvider", "CPUExecutionProvider"
    made: list[tuple[list[str], int | None]] = []
    real_session = OnnxClassifier._session

    class OnDevice:
        def __init__(self, session: object) -> None:
            self._session = session

        def get_providers(self) -> list[str]:
            return [cuda, cpu]

        def __getattr__(self, name: str) -> object:
            return getattr(self._session, name)

    def session(self: OnnxClassifier, variant: str, providers: list[str], threads: int | None, spin: bool | None):  # type: ignore[no-untyped-def]
        made.append((providers, threads))
        s, path = real_session(self, variant, [cpu], threads, spin)
        return (OnDevice(s) if cuda in providers else s), path

    monkeypatch.setattr(ort, "get_available_providers", lambda: [cuda, cpu])
    monkeypatch.setattr(OnnxClassifier, "_session", session)
    clf = OnnxClassifier(tiny_model_dir, variant="fp32", providers=[cuda, cpu], workers=2, intra_op_threads=2)
    assert clf.provider == cuda and clf.workers == 1 and clf.intra_op_threads == 2
    assert made == [([cuda, cpu], 2)]  # one session, on the device, with both threads
    clf_cpu = OnnxClassifier(tiny_model_dir, variant="fp32", providers=[cpu], workers=2, intra_op_threads=2)
    assert clf_cpu.provider == cpu and clf_cpu.workers == 2 and clf_cpu.intra_op_threads == 1
