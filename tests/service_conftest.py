"""Helpers for the service tests: a fake classifier with OnnxClassifier's interface, a real uvicorn
server on localhost in a thread, and the tiny exported ONNX model (session fixture).

Import the fixtures you use into the test module: ``from service_conftest import tiny_model_dir``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from tokenizers import Tokenizer

from dialogue_safety.core.encoding import EncodedExample, EncodingConfig
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import Example, Label, Prediction
from dialogue_safety.service.admission import CLASSIFY, LaneName
from dialogue_safety.service.app import create_app
from dialogue_safety.service.batcher import MicroBatcher
from dialogue_safety.service.server import uvicorn_config
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import Classifier

#: how long a test waits for something that must happen (a server starting, a request answered, a thread
#: ending) before it calls it a hang. Only a guard against hanging forever, never a measure of speed: a
#: loaded 2-core machine can be many times slower than an idle one, so it is generous (what a test asserts
#: about speed is a count, a budget or a ratio within one run; speed itself is measured in lab/bench).
GUARD_S = 120.0

BAD_WORDS = frozenset({"idiot", "idiots", "stupid", "hate"})
BAD_ID, SEP_ID, CLS_ID = 7, 3, 2


async def submit(
    batcher: MicroBatcher, examples: Sequence[Example], *, client: str = "", lane: LaneName = CLASSIFY
) -> list[Prediction]:
    """Predict ``examples`` through ``batcher`` as the service's door does (``ServiceState.score``, without its
    hang-up watch): enqueue, await every future, release them; raises what the batcher raises (Overloaded,
    RequestTooCostly, NotReady, InferenceFailed)."""
    futures = await batcher.enqueue(examples, client=client, lane=lane)
    if len(futures) == 1:
        return [await futures[0]]  # cancelling the caller cancels the future: dropped
    try:
        return list(await asyncio.gather(*futures))
    finally:
        batcher.release(futures)


class FakeClassifier:
    """OnnxClassifier's interface without a model: a word is 'bad' or not.

    The utterance scores 0.9 with a bad word, else 0.1; every bad word in the history adds 0.05
    (so context changes the score). ``gate`` blocks predict_encoded until set, ``warm_gate``
    blocks warmup (both open by default), ``fail_if`` makes a batch raise, ``batches`` records what was predicted.
    """

    workers = parallel = intra_op_threads = 1

    @staticmethod
    def cancel_token() -> SimpleNamespace:
        return SimpleNamespace(terminate=False)

    def __init__(self, *, heads: Sequence[str] = ("offensive", "hateful"), threshold: float = 0.5) -> None:
        self.card = ModelCard(
            name="fake", version="1.2.3", heads=list(heads), score_heads=[heads[0]], threshold=threshold
        )
        self.model_id = self.card.model_id
        self.variant = "fp32"
        self.provider = "CPUExecutionProvider"
        self.check_band = 0.0  # no int8 check (an fp32 model)
        self.check_thresholds: tuple[float, ...] = ()
        self.checked_items = 0
        self.gate = threading.Event()  # predict_encoded waits for it (clear() holds batches)
        self.gate.set()
        self.warm_gate = threading.Event()  # warmup waits for it (clear() keeps the service unready)
        self.warm_gate.set()
        self.entered = threading.Event()  # set when a predict call starts
        self.fail_if: Callable[[list[EncodedExample]], bool] | None = None
        self.batches: list[list[EncodedExample]] = []
        self.warmed = False

    @staticmethod
    def _ids(text: str) -> list[int]:
        return [BAD_ID if w.strip(".,!?").lower() in BAD_WORDS else 10 + len(w) for w in text.split()]

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        out = []
        for ex in examples:
            a = [CLS_ID]
            for turn in ex.history:
                a += [*self._ids(turn.text), SEP_ID]
            if len(a) == 1:
                a.append(SEP_ID)
            b = [*self._ids(ex.utterance)[:60], SEP_ID]
            out.append(EncodedExample(tuple(a + b), (0,) * len(a) + (1,) * len(b), (1,) * (len(a) + len(b))))
        return out

    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: object = None) -> np.ndarray:
        """One call of the model: each row's score (the batcher's calls are recorded in ``batches``)."""
        self.entered.set()
        if not self.gate.wait(10):
            raise TimeoutError("test gate never opened")
        batch = list(rows)
        if self.fail_if is not None and self.fail_if(batch):
            raise RuntimeError("injected batch failure")
        self.batches.append(batch)
        scores = []
        for e in batch:
            b = [i for i, tt in zip(e.input_ids, e.token_type_ids, strict=True) if tt == 1]
            a = [i for i, tt in zip(e.input_ids, e.token_type_ids, strict=True) if tt == 0]
            scores.append([min(0.99, (0.9 if BAD_ID in b else 0.1) + 0.05 * a.count(BAD_ID))])
        return np.array(scores)

    def predict_scored(
        self, encoded: Sequence[EncodedExample], scored: Callable[[Sequence[EncodedExample]], np.ndarray]
    ) -> list[Prediction]:
        return self._predictions(encoded, scored, None)

    def predict_encoded(self, encoded: Sequence[EncodedExample], threshold: float | None = None) -> list[Prediction]:
        return self._predictions(encoded, self.row_logits, threshold) if encoded else []

    def _predictions(
        self,
        encoded: Sequence[EncodedExample],
        scored: Callable[[Sequence[EncodedExample]], np.ndarray],
        threshold: float | None,
    ) -> list[Prediction]:
        t = self.card.threshold if threshold is None else threshold
        preds = []
        for row_scores in scored(list(encoded)):  # one row per item (no windows here)
            score = float(row_scores[0])
            cats = {h: score if i == 0 else score / 2 for i, h in enumerate(self.card.heads)}
            preds.append(Prediction(score=score, label=Label.from_bool(score >= t), threshold=t, categories=cats))
        return preds

    def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]:
        return self.predict_encoded(self.encode(examples), threshold)

    def warmup(self) -> None:
        if not self.warm_gate.wait(10):
            raise TimeoutError("warm-up gate never opened")
        self.warmed = True


@dataclass
class LiveServer:
    """A real uvicorn server on 127.0.0.1 running in a thread."""

    server: uvicorn.Server
    thread: threading.Thread
    app: Any
    classifier: Classifier | None = None
    port: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=GUARD_S, **kwargs)

    def wait_ready(self, timeout: float = GUARD_S) -> None:
        """Block until /ready answers 200 (bounded; fails the test otherwise)."""
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while time.monotonic() < deadline:
                if c.get("/ready").status_code == 200:
                    return
                time.sleep(0.02)
        pytest.fail("the service never became ready")


@contextmanager
def live_server(
    settings: ServiceSettings | None = None,
    classifier: Classifier | None = None,
    *,
    wait_ready: bool = True,
    factory: Callable[[ServiceSettings], Classifier] | None = None,
    **overrides: Any,
) -> Iterator[LiveServer]:
    """Run ``create_app`` (with ``classifier`` if given, or ``factory``, else the real ONNX runtime) under uvicorn."""
    base = settings or ServiceSettings(host="127.0.0.1", port=0, **overrides)
    if classifier is not None:
        factory = lambda _s: classifier  # noqa: E731
    app = create_app(base, classifier_factory=factory)
    config = uvicorn_config(
        app, base, host="127.0.0.1", port=0, log_level="warning", access_log=False, timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + GUARD_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    live = LiveServer(server, thread, app, classifier, port, extra={"guard": config.connection_guard})
    try:
        if wait_ready:
            live.wait_ready()
        yield live
    finally:
        server.should_exit = True
        thread.join(15)


_EXPORTED: dict[Path, Path] = {}


def export_tiny_model(checkpoint: Path, out_root: Path) -> Path:
    """The tiny checkpoint exported to an ONNX model directory (fp32 only), once per session."""
    if checkpoint not in _EXPORTED:
        from dialogue_safety.export.onnx_export import export_checkpoint

        _EXPORTED[checkpoint] = export_checkpoint(checkpoint, out_root / "tiny_model", variant_names=("fp32",)).out_dir
    return _EXPORTED[checkpoint]


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_checkpoint`` exported with ``dialogue_safety.export.onnx_export.export_checkpoint``
    (shared by modules)."""
    return export_tiny_model(tiny_checkpoint, tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def decomposed_model_dir(tiny_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random two-head model with the decomposed encoding (a context head read from the dialogue
    row, the other from the utterance alone: every example with history has an utterance-alone row)."""
    import torch

    from dialogue_safety.export.onnx_export import export_checkpoint
    from dialogue_safety.training.checkpoint import save_checkpoint
    from dialogue_safety.training.modeling import build_model

    torch.manual_seed(3)
    heads = ["offensive", "unsafe_in_context"]
    model = build_model("random:tiny", heads, vocab_size=tiny_tokenizer.get_vocab_size())
    card = ModelCard(
        name="tiny-decomposed",
        version="0.0.1",
        heads=heads,
        score_heads=heads,
        context_heads=["unsafe_in_context"],
        threshold=0.5,
        encoding=EncodingConfig(context_mode="decomposed").to_dict(),
    )
    checkpoint = save_checkpoint(tmp_path_factory.mktemp("decomposed_ckpt"), model, tiny_tokenizer, card)
    out = tmp_path_factory.mktemp("decomposed") / "model"
    export_checkpoint(checkpoint, out, variant_names=["fp32"])
    return out


# The break-it score board as rows of cell texts, read in one go inside the page: the board may be
# re-rendered between a locator's query and its reads (a detached row's innerText has no tabs).
SCOREBOARD_ROWS_JS = (
    "Array.from(document.querySelectorAll('#scoreboard tr')).map((tr) => Array.from(tr.cells, (td) => td.textContent))"
)
