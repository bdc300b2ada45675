"""``python -m lab.bench runtime``: how fast the classifier runs, per engine, on this machine.

Engines: torch eager and the naive exports of the checkpoint (``--checkpoint``, the card's source checkpoint,
or one rebuilt from the model directory's weights: :mod:`dialogue_safety.export.weights_back`), onnxruntime
fp32, optimized and int8 on CPU, and fp16 on CUDA when onnxruntime-gpu and a GPU are present. For each engine:

* **single**: p50/p99 latency of ``predict([dialogue])`` over real dialogues, tokenisation
  included (what one chatbot turn costs), plus the model-only p50;
* **throughput** over the whole dialogue set, tokenisation included, two batching policies:
  length-sorted batches of 64, and token-budget batches (≤ the service's max_batch_tokens padded
  tokens, ≤ 256 examples);
  examples/s, real tokens/s, padding overhead, useful GFLOP/s and fraction of peak;
* **sweep**: batch size × sequence length on synthetic token ids (model only);
* **long messages**: p50 latency of ``predict([message])`` for one message without history of
  500, 1,000, 4,000 and 16,000 characters of the dialogues' own text (every window read: no cap),
  its windows, the cost per window and the ratio to the 500-character message.

Single dialogues and throughput are measured in turns (``repeats`` rounds, each timing every engine on a
share of the single dialogues and one pass per policy: :func:`measure_interleaved`), so that a machine
that speeds up or slows down during the run moves every engine alike; the engines are all loaded first.
FLOPs and peak are explained in :mod:`lab.bench.flops`. Dialogues: the DiaSafety + ConvAbuse
test splits via ``dialogue_safety.sources.registry``; synthetic dialogues (noted in the output) when
they are not available. ``--geometry bert-base`` benchmarks a randomly initialised model of that
geometry (the paper's architecture). ``--smoke`` runs every step for a moment on a tiny model
(the test suite uses it; no timing targets apply). Prints the JSON report and markdown tables;
``--json PATH`` also writes the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.batch_budget import MAX_BATCH_TOKENS, token_budget_batches
from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample, pad_batch
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import TOKENIZER_FILE, is_checkpoint, is_model_dir, model_dir_problem
from dialogue_safety.core.schema import Example
from lab.bench.dialogues import load_dialogues
from lab.bench.emit import emit_report
from lab.bench.flops import (
    AVX2_KEY,
    cpu_peak,
    flops_per_token,
    fraction_of_peak,
    non_embedding_parameters,
    sequence_flops,
)
from lab.bench.op_profile import engine_ops, ops_markdown

TARGET_SINGLE_P50_MS = 5.0
TARGET_SORTED64_EXAMPLES_PER_S = 220.0
# relative targets, from one run: the CPU default against the naive exports of the same checkpoint, on every CPU
# family (issue 53; issue 21 asked 2.0x batched, 0.5x single and 1.2x naive int8)
TARGET_VS_NAIVE_FP32 = 2.0  # batched throughput, x naive torch.onnx.export + onnxruntime fp32
TARGET_SINGLE_FRACTION = 1.0  # single-dialogue p50, fraction of the naive fp32's (the goal: GOAL_SINGLE_FRACTION)
GOAL_SINGLE_FRACTION = 0.5
TARGET_INT8_VS_NAIVE_INT8 = 1.0  # an int8 default's batched throughput, x naive quantize_dynamic
#: the variants whose figures --record-card writes into the card (those the runtime may serve on a CPU)
RECORDED_VARIANTS = ("fp32", "optimized", "int8")


@dataclass(frozen=True)
class RuntimePlan:
    singles: int  # single-dialogue predictions timed per engine
    repeats: int  # throughput passes per policy (the best is reported, all are kept)
    examples: int  # dialogues in the realistic set at most
    sweep_batches: tuple[int, ...]
    sweep_lengths: tuple[int, ...]
    sweep_seconds: float  # time per sweep cell at least
    warmup: int  # untimed calls before each measurement


FULL = RuntimePlan(500, 3, 4000, (1, 8, 32, 64), (16, 32, 64, 128), 1.0, 20)
SMOKE = RuntimePlan(4, 1, 16, (1, 4), (16,), 0.0, 1)
SORTED_BATCH = 64  # the length-sorted policy's batch size (and the ops profile's batched shape)
LONG_MESSAGE_CHARS: tuple[int, ...] = (500, 1000, 4000, 16000)  # the first is the reference
TARGET_LONG_RATIO = 10.0  # a 4,000-character message costs at most this many 500-character ones


# -- engines -----------------------------------------------------------------------------------
class Engine:
    """What the benchmark times: end-to-end ``predict`` and model-only ``run_padded``."""

    name: str
    variant: str
    provider: str
    encoder: DialogueEncoder
    card: ModelCard
    file_bytes: int | None = None

    def set_batching(self, max_batch_tokens: int, max_batch_size: int) -> None:
        raise NotImplementedError

    def predict(self, examples: Sequence[Example]) -> Any:
        raise NotImplementedError

    def run_padded(self, feeds: dict[str, np.ndarray]) -> Any:
        raise NotImplementedError

    def onnx_file(self) -> tuple[Path, Callable[[], Any]] | None:
        """The ONNX file a CPU onnxruntime engine runs and a factory of its session options (None: not one)."""
        return None


class OnnxEngine(Engine):
    """``one_pass``: a decomposed model without its second pass over the utterances alone (every head
    read from the dialogue row): not what the service answers, only what that pass costs."""

    def __init__(self, model_dir: Path, variant: str, threads: int, spin: bool | None, one_pass: bool = False) -> None:
        from dialogue_safety.core.runtime import OnnxClassifier

        unchecked = variant == UNCHECKED_INT8  # int8 without the card's fp32 check near the threshold
        variant = "int8" if unchecked else variant
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if variant == "fp16" else ["CPUExecutionProvider"]
        self.clf = OnnxClassifier(
            model_dir,
            variant=variant,
            providers=providers,
            intra_op_threads=threads,
            allow_spinning=spin,
            max_windows=None,  # long messages: every window read
            int8_check=not unchecked,
        )
        self.name = f"onnxruntime {variant}" + (" one pass" if one_pass else "") + (" unchecked" if unchecked else "")
        if one_pass:
            self.clf._context_cols = []
        self.variant, self.provider = self.clf.variant, self.clf.provider
        self.encoder, self.card = self.clf.encoder, self.clf.card
        self.file_bytes = self.clf.path.stat().st_size
        self._names = {i.name for i in self.clf.session.get_inputs()}
        self._options = (threads, spin)

    def onnx_file(self) -> tuple[Path, Callable[[], Any]] | None:
        from dialogue_safety.core.runtime import CPU, session_options

        return (self.clf.path, lambda: session_options(*self._options)) if self.provider == CPU else None

    def set_batching(self, max_batch_tokens: int, max_batch_size: int) -> None:
        self.clf.max_batch_tokens, self.clf.max_batch_size = max_batch_tokens, max_batch_size

    def predict(self, examples: Sequence[Example]) -> Any:
        return self.clf.predict(examples)

    def run_padded(self, feeds: dict[str, np.ndarray]) -> Any:
        return self.clf.session.run(["logits"], {k: v for k, v in feeds.items() if k in self._names})


class RowsEngine(Engine):
    """An engine outside the runtime with the runtime's encoding, batching and scoring (a decomposed
    model's second pass included): only :meth:`run_padded` differs, so the ratios compare the models."""

    max_batch_tokens: int = MAX_BATCH_TOKENS
    max_batch_size: int = 256

    def set_batching(self, max_batch_tokens: int, max_batch_size: int) -> None:
        self.max_batch_tokens, self.max_batch_size = max_batch_tokens, max_batch_size

    def predict(self, examples: Sequence[Example]) -> Any:
        from dialogue_safety.core.scoring import context_columns, decomposed_logits, predictions_from_logits

        def rows(encoded: Sequence[EncodedExample]) -> np.ndarray:
            logits = np.empty((len(encoded), len(self.card.heads)), dtype=np.float32)
            for idx in token_budget_batches([len(e) for e in encoded], self.max_batch_tokens, self.max_batch_size):
                out = self.run_padded(pad_batch([encoded[i] for i in idx], self.encoder.pad_id))
                logits[idx] = np.asarray(out[0] if isinstance(out, list) else out).reshape(len(idx), -1)
            return logits

        encoded = self.encoder.encode_batch(examples, max_windows=None)  # every window, as the runtime reads them
        return predictions_from_logits(decomposed_logits(encoded, rows, context_columns(self.card)), self.card)


class TorchEngine(RowsEngine):
    """The checkpoint in torch eager mode, same encoding, batching and scoring as the runtime."""

    def __init__(self, checkpoint: Path, threads: int) -> None:
        import torch

        from dialogue_safety.training.checkpoint import load_checkpoint

        torch.set_num_threads(threads)
        self.torch = torch
        self.model, self.encoder, self.card = load_checkpoint(checkpoint)
        self.name, self.variant, self.provider = "torch eager", "fp32", f"torch {torch.__version__} CPU"

    def run_padded(self, feeds: dict[str, np.ndarray]) -> Any:
        with self.torch.inference_mode():
            return self.model(**{k: self.torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()


NAIVE_ENGINES = ("naive-fp32", "naive-int8")
UNCHECKED_INT8 = "int8-unchecked"  # what the int8 check costs: the int8 graph answering alone


def export_naive(checkpoint: Path, out_dir: Path) -> dict[str, Any]:
    """What a user gets in ten minutes from the same checkpoint: ``torch.onnx.export`` with its defaults
    (dynamic batch and sequence axes), and ``quantize_dynamic`` with its defaults on that graph.
    Returns ``{"fp32": path, "int8": path, "exporter": ...}``."""
    import torch
    from onnxruntime.quantization import quantize_dynamic

    from dialogue_safety.core.variants.graphs import quiet_onnxruntime_tools
    from dialogue_safety.training.checkpoint import load_checkpoint

    model, encoder, _ = load_checkpoint(checkpoint)
    model.eval()
    feeds = pad_batch(encoder.encode_batch([Example.from_texts("hello there", ["hi"])]), encoder.pad_id)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    axes = {n: {0: "batch", 1: "sequence"} for n in names} | {"logits": {0: "batch"}}
    fp32, int8 = out_dir / "naive.onnx", out_dir / "naive.int8.onnx"
    exporter = "torch.onnx.export (TorchScript, dynamo=False)"
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, args, str(fp32), input_names=names, output_names=["logits"], dynamic_axes=axes, dynamo=False
        )
    with quiet_onnxruntime_tools():
        quantize_dynamic(fp32, int8)  # defaults: QInt8 weights per tensor, every supported op
    return {"fp32": fp32, "int8": int8, "exporter": exporter}


class NaiveOnnxEngine(RowsEngine):
    """A naive export (:func:`export_naive`) in a default onnxruntime session (same thread count)."""

    def __init__(self, path: Path, checkpoint: Path, name: str, threads: int) -> None:
        import onnxruntime as ort

        from dialogue_safety.training.checkpoint import load_checkpoint

        _, self.encoder, self.card = load_checkpoint(checkpoint)
        self.session = ort.InferenceSession(str(path), self._options(threads), providers=["CPUExecutionProvider"])
        self.name, self.variant, self.provider = name, name, "CPUExecutionProvider"
        self.file_bytes = path.stat().st_size
        self._path, self._threads = path, threads

    @staticmethod
    def _options(threads: int) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()  # onnxruntime's defaults but the thread count
        options.intra_op_num_threads = threads
        return options

    def onnx_file(self) -> tuple[Path, Callable[[], Any]] | None:
        return self._path, lambda: self._options(self._threads)

    def run_padded(self, feeds: dict[str, np.ndarray]) -> Any:
        return self.session.run(["logits"], feeds)


# -- measurements ------------------------------------------------------------------------------
def _percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def single_samples(examples: Sequence[Example], plan: RuntimePlan) -> list[Example]:
    """The dialogues every engine times one at a time (the same ones, in the same order)."""
    return [examples[i % len(examples)] for i in range(plan.singles)]


def time_single(engine: Engine, sample: Sequence[Example]) -> tuple[list[float], list[float]]:
    """(whole-prediction seconds, model-only seconds) of one-dialogue predictions over ``sample``."""
    total: list[float] = []
    for ex in sample:
        start = time.perf_counter()
        engine.predict([ex])
        total.append(time.perf_counter() - start)
    feeds = [pad_batch(engine.encoder.encode_batch([ex]), engine.encoder.pad_id) for ex in sample]
    model_only: list[float] = []
    for f in feeds:
        start = time.perf_counter()
        engine.run_padded(f)
        model_only.append(time.perf_counter() - start)
    return total, model_only


def single_summary(total: Sequence[float], model_only: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(total),
        "p50_ms": round(1e3 * _percentile(total, 50), 3),
        "p99_ms": round(1e3 * _percentile(total, 99), 3),
        "mean_ms": round(1e3 * float(np.mean(total)), 3),
        "model_only_p50_ms": round(1e3 * _percentile(model_only, 50), 3),
    }


def long_messages(examples: Sequence[Example], chars: Sequence[int], per_length: int) -> dict[int, list[Example]]:
    """``per_length`` messages without history of each length in ``chars``: the dialogues' own text
    (utterances and turns, in order), cut at a word, each message from a different place."""
    words = " ".join(t for ex in examples for t in (*(turn.text for turn in ex.history), ex.utterance)).split()
    if not words:
        words = ["word"]
    out: dict[int, list[Example]] = {}
    for n in chars:
        messages = []
        for k in range(per_length):
            start, text = (k * 997) % len(words), ""
            i = start
            while len(text) < n:
                text += (" " if text else "") + words[i % len(words)]
                i += 1
            messages.append(Example(utterance=text[:n].rsplit(" ", 1)[0] if " " in text[:n] else text[:n]))
        out[n] = messages
    return out


def measure_long(engine: Engine, messages: dict[int, list[Example]], warmup: int) -> list[dict[str, Any]]:
    """p50 latency of one long message, its windows and the cost per window (every window read)."""
    rows: list[dict[str, Any]] = []
    for n, batch in messages.items():
        encoded = engine.encoder.encode_batch(batch, max_windows=None)
        for ex in batch[:warmup]:
            engine.predict([ex])
        times = []
        for ex in batch:
            start = time.perf_counter()
            engine.predict([ex])
            times.append(time.perf_counter() - start)
        windows = float(np.mean([len(e.rows) for e in encoded]))
        model_rows = float(np.mean([len(e.rows) + (len(e.alone.rows) if e.alone else 0) for e in encoded]))
        p50 = 1e3 * _percentile(times, 50)
        rows.append(
            {
                "chars": n,
                "n": len(batch),
                "windows": round(windows, 1),
                "rows": round(model_rows, 1),
                "tokens": round(float(np.mean([e.tokens for e in encoded])), 1),
                "p50_ms": round(p50, 3),
                "ms_per_window": round(p50 / windows, 3),
            }
        )
    ref = rows[0]["p50_ms"] if rows else None
    for r in rows:
        r["x_first"] = round(r["p50_ms"] / ref, 2) if ref else None
    return rows


def batching_stats(lengths: Sequence[int], max_batch_tokens: int, max_batch_size: int) -> dict[str, Any]:
    """Batches, padded tokens and padding overhead of the runtime's policy on these lengths."""
    arr = np.asarray(lengths)
    batches = list(token_budget_batches(arr, max_batch_tokens, max_batch_size))
    padded = int(sum(len(b) * int(arr[b].max()) for b in batches))
    real = int(arr.sum())
    return {
        "batches": len(batches),
        "real_tokens": real,
        "padded_tokens": padded,
        "padding_overhead": round(padded / real - 1, 4),
    }


def throughput_pass(engine: Engine, examples: Sequence[Example], policy: tuple[int, int]) -> float:
    """Seconds for one end-to-end pass over ``examples`` (tokenisation included) under one batching policy."""
    engine.set_batching(*policy)
    start = time.perf_counter()
    engine.predict(examples)
    return time.perf_counter() - start


def warm_throughput(engine: Engine, examples: Sequence[Example], policy: tuple[int, int]) -> None:
    engine.set_batching(*policy)
    engine.predict(examples[: max(1, min(len(examples), policy[1]))])  # the largest shapes first


def throughput_summary(
    runs: Sequence[float],
    n_examples: int,
    lengths: Sequence[int],
    policy: tuple[int, int],
    geometry: dict[str, int],
    peak: dict[str, Any],
) -> dict[str, Any]:
    """examples/s, tokens/s, padding and FLOP/s of the best of ``runs`` (all kept)."""
    max_batch_tokens, max_batch = policy
    best = min(runs)
    stats = batching_stats(lengths, max_batch_tokens, max_batch)
    flops = sequence_flops(geometry, lengths) if geometry else 0.0
    return {
        "max_batch_tokens": max_batch_tokens,
        "max_batch_size": max_batch,
        **stats,
        "seconds": [round(r, 4) for r in runs],
        "examples_per_s": round(n_examples / best, 1),
        "tokens_per_s": round(stats["real_tokens"] / best, 1),
        "useful_gflops_per_s": round(flops / best / 1e9, 2) if flops else None,
        "fraction_of_peak": fraction_of_peak(flops / best, peak) if flops else None,
        "fraction_of_avx2_fma_peak": fraction_of_peak(flops / best, peak, AVX2_KEY) if flops else None,
    }


def measure_interleaved(
    engines: Sequence[tuple[str, Engine]],
    examples: Sequence[Example],
    lengths: Sequence[int],
    policies: dict[str, tuple[int, int]],
    plan: RuntimePlan,
    geometry: dict[str, int],
    peak: dict[str, Any],
    say: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Single-dialogue latency and throughput of every engine, measured in turns: each round times every
    engine once (a share of the single dialogues, one pass per policy), so that a machine that speeds up or
    slows down during the run moves every engine alike. Returns ``{name: {"single", <policy>...}}``."""
    sample = single_samples(examples, plan)
    rounds = max(1, plan.repeats)
    single: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, _ in engines}
    runs: dict[str, dict[str, list[float]]] = {name: {p: [] for p in policies} for name, _ in engines}
    for _, engine in engines:
        for ex in sample[: plan.warmup]:
            engine.predict([ex])
        for policy in policies.values():
            warm_throughput(engine, examples, policy)
    for r in range(rounds):
        say(f"  round {r + 1}/{rounds}: " + ", ".join(name for name, _ in engines))
        for name, engine in engines:
            total, model_only = time_single(engine, sample[r::rounds])
            single[name][0].extend(total)
            single[name][1].extend(model_only)
            for key, policy in policies.items():
                runs[name][key].append(throughput_pass(engine, examples, policy))
    return {
        name: {
            "single": single_summary(*single[name]),
            **{
                key: throughput_summary(runs[name][key], len(examples), lengths, policy, geometry, peak)
                for key, policy in policies.items()
            },
        }
        for name, _ in engines
    }


def synthetic_feeds(batch: int, seq_len: int, vocab_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch of random ids, every row ``seq_len`` long, segment B in the second half."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000 if vocab_size > 2000 else 5, vocab_size, size=(batch, seq_len), dtype=np.int64)
    types = np.zeros_like(ids)
    types[:, seq_len // 2 :] = 1
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types}


def sweep(
    engine: Engine, plan: RuntimePlan, geometry: dict[str, int], vocab_size: int, peak: dict[str, Any]
) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    for batch in plan.sweep_batches:
        for seq_len in plan.sweep_lengths:
            feeds = synthetic_feeds(batch, seq_len, vocab_size)
            for _ in range(max(1, plan.warmup // 4)):
                engine.run_padded(feeds)
            times: list[float] = []
            deadline = time.perf_counter() + plan.sweep_seconds
            while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 10_000):
                start = time.perf_counter()
                engine.run_padded(feeds)
                times.append(time.perf_counter() - start)
            t = _percentile(times, 50)
            flops = batch * seq_len * flops_per_token(geometry, seq_len) if geometry else 0.0
            cells.append(
                {
                    "engine": engine.name,
                    "batch": batch,
                    "seq_len": seq_len,
                    "ms_per_batch": round(1e3 * t, 3),
                    "examples_per_s": round(batch / t, 1),
                    "tokens_per_s": round(batch * seq_len / t, 1),
                    "gflops_per_s": round(flops / t / 1e9, 2) if flops else None,
                    "fraction_of_peak": fraction_of_peak(flops / t, peak) if flops else None,
                    "fraction_of_avx2_fma_peak": fraction_of_peak(flops / t, peak, AVX2_KEY) if flops else None,
                }
            )
    return cells


# -- models ------------------------------------------------------------------------------------
@dataclass
class Subject:
    """What is benchmarked: an ONNX model directory and (if known) its torch checkpoint."""

    model_dir: Path
    checkpoint: Path | None
    description: str
    notes: tuple[str, ...] = ()  # what the report should say about how the subject was found


def _random_checkpoint(geometry: str, out: Path) -> Path:
    import torch

    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.training.checkpoint import save_checkpoint
    from dialogue_safety.training.modeling import build_model, load_base_tokenizer

    torch.manual_seed(0)
    tokenizer = load_base_tokenizer(f"random:{geometry}")
    model = build_model(f"random:{geometry}", ["offensive"], vocab_size=tokenizer.get_vocab_size())
    card = ModelCard(name=f"random-{geometry}", version="0.0.0", base_model=f"random:{geometry}")
    return save_checkpoint(out, model, tokenizer, card)


def _export(checkpoint: Path, out: Path, variant_names: Sequence[str]) -> Path:
    from dialogue_safety.export.onnx_export import export_checkpoint

    names = [v for v in variant_names if v not in ("torch", *NAIVE_ENGINES, UNCHECKED_INT8)]
    if UNCHECKED_INT8 in variant_names and "int8" not in names:
        names.append("int8")
    export_checkpoint(checkpoint, out, variant_names=names or ["fp32"], test_sets=None)
    return out


def _source_checkpoint(model_dir: Path) -> Path | None:
    """The checkpoint a model directory was exported from, if the card names one that still exists."""
    try:
        source = ModelCard.load(model_dir).export.get("source_checkpoint")
    except (FileNotFoundError, ValueError):
        return None
    return Path(source) if source and is_checkpoint(source) else None


def _rebuilt_checkpoint(model_dir: Path, out: Path) -> tuple[Path | None, tuple[str, ...]]:
    """The checkpoint rebuilt from the model directory's own weights (the shipped directory has none):
    what the naive exports and torch eager start from (:mod:`dialogue_safety.export.weights_back`), and the
    report's note saying so; None, with the reason, without torch or when the graph cannot be read back
    (those engines are then skipped, as without a checkpoint)."""
    try:
        from dialogue_safety.export.onnx_export import ExportError
        from dialogue_safety.export.weights_back import checkpoint_from_model_dir
    except ImportError as exc:
        return None, (f"no checkpoint could be rebuilt from the model directory ({exc})",)
    try:
        checkpoint_from_model_dir(model_dir, out)
    except ExportError as exc:
        return None, (f"no checkpoint could be rebuilt from the model directory: {exc}",)
    return out, (
        "torch eager and the naive exports start from a checkpoint rebuilt from the model directory's own "
        "weights (as served; pass --checkpoint DIR for the original)",
    )


def _model_dir_subject(model_dir: Path, checkpoint: Path | None, variant_names: Sequence[str], tmp: Path) -> Subject:
    """A model directory and its checkpoint: the one given, the card's source checkpoint, or (when the
    engines need one) one rebuilt from the directory's weights."""
    checkpoint = checkpoint or _source_checkpoint(model_dir)
    notes: tuple[str, ...] = ()
    if checkpoint is None and set(variant_names) & {"torch", *NAIVE_ENGINES}:
        checkpoint, notes = _rebuilt_checkpoint(model_dir, tmp / "checkpoint")
    return Subject(model_dir, checkpoint, str(model_dir), notes)


@contextlib.contextmanager
def subject_for(args: argparse.Namespace, variant_names: Sequence[str]) -> Iterator[Subject]:
    """Resolve --model / --checkpoint / --geometry (/ --smoke) to a model directory, exporting if needed."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    try:
        if args.geometry:
            ckpt = _random_checkpoint(args.geometry, tmp / "checkpoint")
            yield Subject(_export(ckpt, tmp / "model", variant_names), ckpt, f"random:{args.geometry} (random weights)")
        elif args.model is not None:
            yield _model_dir_subject(args.model, args.checkpoint, variant_names, tmp)
        elif args.checkpoint is not None:
            yield Subject(_export(args.checkpoint, tmp / "model", variant_names), args.checkpoint, str(args.checkpoint))
        elif args.smoke:
            ckpt = _random_checkpoint("tiny", tmp / "checkpoint")
            yield Subject(_export(ckpt, tmp / "model", variant_names), ckpt, "random:tiny (smoke)")
        else:
            from dialogue_safety.core.model_dir import default_model_dir

            yield _model_dir_subject(default_model_dir(), None, variant_names, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the run -----------------------------------------------------------------------------------
def _geometry(card: ModelCard) -> dict[str, int]:
    geometry = dict(card.export.get("geometry") or {})
    return geometry if {"hidden_size", "num_hidden_layers"} <= set(geometry) else {}


def run(
    args: argparse.Namespace, subject: Subject, variant_names: list[str], say: Callable[[str], None]
) -> dict[str, Any]:
    from dialogue_safety.core.cpu import cpu_family
    from dialogue_safety.core.runtime import cpu_default, cuda_available, physical_cores

    plan = SMOKE if args.smoke else FULL
    if args.examples:
        plan = RuntimePlan(**{**asdict(plan), "examples": args.examples})
    if args.singles:
        plan = RuntimePlan(**{**asdict(plan), "singles": args.singles})
    threads = args.threads or (1 if args.smoke else physical_cores())  # smoke: robust on a busy machine
    spin = {"on": True, "off": False, "default": None}[args.spin]
    card = ModelCard.load(subject.model_dir)
    geometry = _geometry(card)
    peak = cpu_peak(threads)
    examples, data_note = load_dialogues(args.data_dir, plan.examples)
    load_start = os.getloadavg()
    say(f"bench runtime: {subject.description}; {len(examples)} dialogues ({data_note}); {threads} threads")
    served_cpu, served_why = cpu_default(card)  # what the runtime serves on this CPU when asked for no variant

    engines: list[tuple[str, Callable[[], Engine]]] = []
    naive: dict[str, Any] = {}

    def naive_engine(name: str) -> Engine:
        assert subject.checkpoint is not None
        if not naive:
            say("  naive: torch.onnx.export + quantize_dynamic of the checkpoint")
            naive.update(export_naive(subject.checkpoint, Path(tempfile.mkdtemp(prefix="bench-naive-"))))
        return NaiveOnnxEngine(naive[name.split("-")[1]], subject.checkpoint, name, threads)

    for name in variant_names:
        if name == "torch" or name in NAIVE_ENGINES:
            if subject.checkpoint is not None:
                if name == "torch":
                    engines.append((name, lambda: TorchEngine(subject.checkpoint, threads)))  # type: ignore[arg-type]
                else:
                    engines.append((name, lambda name=name: naive_engine(name)))  # type: ignore[misc]
        elif name == "fp16" and not cuda_available():
            continue
        else:
            engines.append((name, lambda name=name: OnnxEngine(subject.model_dir, name, threads, spin)))  # type: ignore[misc]
    vs_card = ModelCard.load(args.vs) if args.vs is not None else None
    if vs_card is not None:  # another model's served default, timed in the same rounds (e.g. the previous release)

        def vs_engine() -> Engine:
            assert vs_card is not None
            engine = OnnxEngine(args.vs, vs_card.cpu_variant, threads, spin)
            engine.name = f"{vs_card.model_id} onnxruntime {vs_card.cpu_variant} (--vs)"
            engine.variant = VS_PREFIX + vs_card.cpu_variant
            return engine

        engines.append((VS_PREFIX + vs_card.cpu_variant, vs_engine))
    if args.one_pass and card.encoding_config.context_mode == "decomposed":
        served = served_cpu
        engines.append(
            (f"{served}-one-pass", lambda: OnnxEngine(subject.model_dir, served, threads, spin, one_pass=True))
        )

    long_chars = LONG_MESSAGE_CHARS[:2] if args.smoke else LONG_MESSAGE_CHARS
    messages = long_messages(examples, long_chars, max(2, plan.singles // 20))
    encoder = DialogueEncoder.from_file(subject.model_dir / TOKENIZER_FILE, card.encoding_config)
    encoded: list[EncodedExample] = encoder.encode_batch(examples)
    lengths = [len(e) for e in encoded]
    report: dict[str, Any] = {
        "benchmark": "runtime",
        "smoke": bool(args.smoke),
        "model": card.model_id,
        "subject": subject.description,
        "model_dir": str(subject.model_dir),
        "cpu_variant": served_cpu,
        "cpu_variant_why": served_why,
        "cpu_family": cpu_family(),
        "geometry": geometry,
        "data": data_note,
        "dialogues": {
            "n": len(lengths),
            "mean_tokens": round(float(np.mean(lengths)), 1),
            "p50_tokens": int(np.percentile(lengths, 50)),
            "p95_tokens": int(np.percentile(lengths, 95)),
            "max_tokens": int(max(lengths)),
        },
        "machine": {
            **peak,
            "platform": platform.platform(),
            "load_average_at_start": [round(x, 2) for x in load_start],
        },
        "threads": threads,
        "allow_spinning": args.spin,
        "max_batch_tokens": args.max_batch_tokens,
        "plan": asdict(plan),
        "versions": _versions(),
        "engines": [],
        "sweep": [],
        "notes": [],
    }
    if vs_card is not None:
        report["vs"] = {"model": vs_card.model_id, "model_dir": str(args.vs), "cpu_variant": vs_card.cpu_variant}
    if geometry:
        mean_len = float(np.mean(lengths))
        report["flops"] = {
            "formula": "2 x non-embedding params + 4 x layers x hidden x seq, per real token",
            "non_embedding_parameters": non_embedding_parameters(geometry),
            "flops_per_token_at_mean_length": round(flops_per_token(geometry, round(mean_len))),
            "peak_used": "fraction_of_peak: peak_gflops_isa (cores x nominal clock x FLOP/cycle of the detected ISA); "
            "fraction_of_avx2_fma_peak: cores x nominal clock x 32",
        }
    if "torch" in variant_names and subject.checkpoint is None:
        report["notes"].append(
            "torch eager skipped: no checkpoint (pass --checkpoint DIR, or --model DIR to rebuild one)"
        )
    if set(NAIVE_ENGINES) & set(variant_names) and subject.checkpoint is None:
        report["notes"].append(
            "naive exports skipped: no checkpoint (pass --checkpoint DIR, or --model DIR to rebuild one)"
        )
    report["notes"] += list(subject.notes)
    if "fp16" in variant_names and not cuda_available():
        report["notes"].append("fp16 skipped: needs onnxruntime-gpu and a CUDA device")
    if data_note.startswith("SYNTHETIC"):
        report["notes"].append("dialogues are synthetic: numbers are indicative only")

    loaded: list[tuple[str, Engine]] = []
    for name, make in engines:  # all loaded first: the measurements below take turns
        say(f"  {name}: loading")
        loaded.append((name, make()))
    policies = {"sorted64": (10**9, SORTED_BATCH), "token_budget": (args.max_batch_tokens, 256)}
    say(f"  single dialogues and throughput, {max(1, plan.repeats)} rounds of every engine in turn")
    measured = measure_interleaved(loaded, examples, lengths, policies, plan, geometry, peak, say)
    report["interleaved"] = (
        f"{max(1, plan.repeats)} rounds; each times every engine on a share of the single dialogues and one pass "
        "per batching policy (best pass reported)"
    )
    for name, engine in loaded:
        entry: dict[str, Any] = {
            "engine": engine.name,
            "variant": engine.variant,
            "provider": engine.provider,
            "file_mb": round(engine.file_bytes / 1e6, 1) if engine.file_bytes else None,
            "cpu_default": name == served_cpu,
            **measured[name],
        }
        if not args.no_long:
            say(f"  {name}: long messages")
            entry["long_messages"] = measure_long(engine, messages, plan.warmup)
        report["engines"].append(entry)
        if not args.no_sweep:
            say(f"  {name}: sweep")
            report["sweep"] += sweep(engine, plan, geometry, encoder.tokenizer.get_vocab_size(), peak)
    if not args.no_ops:
        say("  where the time goes: onnxruntime's profile of model-only calls, every engine in turn")
        report["ops"] = measure_ops(loaded, encoded, encoder.pad_id, bool(args.smoke), served_cpu)
    del loaded
    report["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if naive:
        report["naive_exporter"] = naive["exporter"]
        shutil.rmtree(Path(naive["fp32"]).parent, ignore_errors=True)
    report["ratios"] = ratios(report)
    report["targets"] = targets(report)
    if args.record_card:
        report["recorded"] = record_card(subject.model_dir, report, " ".join(sys.argv[1:]))
    return report


def record_card(model_dir: Path, report: dict[str, Any], command: str) -> dict[str, Any] | None:
    """Write this run's figures for the card's CPU variants into ``model_dir``'s card, under this CPU's family
    (``ModelCard.cpu_speed``: what the runtime picks the CPU default from: dialogues/s, the better of the two
    batching policies, and the single-dialogue p50), and render MODEL_CARD.md again. None (nothing written) on a CPU
    with no family, in a smoke run, or when no such variant was measured."""
    from dialogue_safety.core.model_dir import CARD_MARKDOWN_FILE
    from dialogue_safety.export.card_markdown import render_model_card

    family = report.get("cpu_family")
    by_variant = {
        e["variant"]: e
        for e in report["engines"]
        if e["variant"] in RECORDED_VARIANTS and e["engine"] == f"onnxruntime {e['variant']}"
    }
    if report["smoke"] or family is None or not by_variant:
        return None
    figures = {
        v: {
            "dialogues_per_s": max(e["sorted64"]["examples_per_s"], e["token_budget"]["examples_per_s"]),
            "single_p50_ms": e["single"]["p50_ms"],
        }
        for v, e in by_variant.items()
    }
    m = report["machine"]
    entry = {
        "variants": figures,
        "measured": f"{m['cpu']}, {report['threads']} threads, load average {m['load_average_at_start']} -> "
        f"{m.get('load_average_at_end')}, {time.strftime('%Y-%m-%d', time.gmtime())}: "
        f"python -m lab.bench runtime {command}",
    }
    card = ModelCard.load(model_dir)
    card.cpu_speed = {**card.cpu_speed, family: entry}
    card.save(model_dir)
    (model_dir / CARD_MARKDOWN_FILE).write_text(render_model_card(card), encoding="utf-8")
    return {"family": family, **entry}


def measure_ops(
    loaded: Sequence[tuple[str, Engine]],
    encoded: Sequence[EncodedExample],
    pad_id: int,
    smoke: bool,
    cpu_default: str,
) -> dict[str, Any] | None:
    """The report's ops block (:mod:`lab.bench.op_profile`) for the CPU onnxruntime engines
    (each file once: ``int8-unchecked`` runs the int8 one), on the dialogues nearest the median length:
    the nearest alone, and the ``SORTED_BATCH`` nearest padded together; ``cpu_default``: the card's CPU
    variant, whose GEMM speed-ups the targets' lines quote. None without such an engine."""
    files: dict[str, tuple[Path, Callable[[], Any]]] = {}
    for name, engine in loaded:
        found = engine.onnx_file()
        if found is not None and all(found[0] != f for f, _ in files.values()):
            files[name] = found
    if not files or not encoded:
        return None
    p50 = int(np.percentile([len(e) for e in encoded], 50))
    near = sorted(range(len(encoded)), key=lambda i: (abs(len(encoded[i]) - p50), i))
    feeds = {
        "single": pad_batch([encoded[near[0]]], pad_id),
        "batch": pad_batch([encoded[i] for i in near[:SORTED_BATCH]], pad_id),
    }
    targets = {
        "batched_vs_naive_fp32": ("naive-fp32", "batch", TARGET_VS_NAIVE_FP32),
        "single_p50_vs_naive_fp32": ("naive-fp32", "single", 1 / TARGET_SINGLE_FRACTION),
        "int8_batched_vs_naive_int8": ("naive-int8", "batch", TARGET_INT8_VS_NAIVE_INT8),
    }
    return {**engine_ops(files, feeds, smoke, NAIVE_ENGINES, targets), "cpu_default": cpu_default}


#: the variant label of the --vs model's engine (kept apart from this model's own variants)
VS_PREFIX = "vs "


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    """Every engine against the naive fp32 export (and the int8 ones against naive int8), from this run:
    batched throughput (length-sorted 64 and token budget) as x-times, single-dialogue p50 as a fraction."""
    by_name = {e["variant"]: e for e in report["engines"]}
    out: dict[str, Any] = {}
    for base_name in NAIVE_ENGINES:
        base = by_name.get(base_name)
        if base is None:
            continue
        table = {}
        for e in report["engines"]:
            table[e["engine"]] = {
                "sorted64_x": round(e["sorted64"]["examples_per_s"] / base["sorted64"]["examples_per_s"], 2),
                "token_budget_x": round(
                    e["token_budget"]["examples_per_s"] / base["token_budget"]["examples_per_s"], 2
                ),
                "single_p50_fraction": round(e["single"]["p50_ms"] / base["single"]["p50_ms"], 2),
            }
        out[f"vs_{base_name}"] = table
    served = next((e for e in report["engines"] if e["cpu_default"]), None)
    other = next((e for e in report["engines"] if e["variant"].startswith(VS_PREFIX)), None)
    if served is not None and other is not None:  # --vs: this model's served default against the other's
        out["served_vs_model"] = {
            "model": report["vs"]["model"],
            "single_p50_x": round(served["single"]["p50_ms"] / other["single"]["p50_ms"], 2),
            "single_p99_x": round(served["single"]["p99_ms"] / other["single"]["p99_ms"], 2),
            "sorted64_time_x": round(other["sorted64"]["examples_per_s"] / served["sorted64"]["examples_per_s"], 2),
            "token_budget_time_x": round(
                other["token_budget"]["examples_per_s"] / served["token_budget"]["examples_per_s"], 2
            ),
        }
    return out


def _versions() -> dict[str, str | None]:
    import onnxruntime

    torch_version = None
    if "torch" in sys.modules:
        torch_version = str(sys.modules["torch"].__version__)
    return {"onnxruntime": onnxruntime.__version__, "torch": torch_version, "python": platform.python_version()}


def targets(report: dict[str, Any]) -> dict[str, Any]:
    """The project's CPU targets (2 cores, MiniLM-L6, dialogue test sets), for the CPU default variant."""
    if report["smoke"]:
        return {"note": "smoke run: no targets apply"}
    geometry = report.get("geometry") or {}
    if (geometry.get("hidden_size"), geometry.get("num_hidden_layers")) != (384, 6):
        return {"note": "the targets are for MiniLM-L6 (6 layers, hidden 384); this model has another geometry"}
    default = next((e for e in report["engines"] if e["cpu_default"]), None)
    if default is None:
        return {"note": f"the CPU default variant ({report['cpu_variant']}) was not benchmarked"}
    p50 = default["single"]["p50_ms"]
    rate = default["sorted64"]["examples_per_s"]
    relative: dict[str, Any] = {}
    vs_fp32 = (report.get("ratios") or {}).get("vs_naive-fp32", {}).get(default["engine"])
    if vs_fp32:
        best = max(vs_fp32["sorted64_x"], vs_fp32["token_budget_x"])
        relative["batched_vs_naive_fp32"] = {
            "value": best,
            "limit": TARGET_VS_NAIVE_FP32,
            "met": best >= TARGET_VS_NAIVE_FP32,
        }
        single = vs_fp32["single_p50_fraction"]
        relative["single_p50_vs_naive_fp32"] = {
            "value": single,
            "limit": TARGET_SINGLE_FRACTION,
            "met": single <= TARGET_SINGLE_FRACTION,
            "goal": GOAL_SINGLE_FRACTION,
        }
    vs_int8 = (report.get("ratios") or {}).get("vs_naive-int8", {}).get(default["engine"])
    if vs_int8:  # whichever variant is served
        best = max(vs_int8["sorted64_x"], vs_int8["token_budget_x"])
        relative["int8_batched_vs_naive_int8"] = {
            "value": best,
            "limit": TARGET_INT8_VS_NAIVE_INT8,
            "met": best >= TARGET_INT8_VS_NAIVE_INT8,
        }
    out: dict[str, Any] = {
        **relative,
        "variant": default["variant"],
        "single_p50_ms": {"value": p50, "limit": TARGET_SINGLE_P50_MS, "met": p50 <= TARGET_SINGLE_P50_MS},
        "sorted64_examples_per_s": {
            "value": rate,
            "limit": TARGET_SORTED64_EXAMPLES_PER_S,
            "met": rate >= TARGET_SORTED64_EXAMPLES_PER_S,
        },
        "note": "targets are for 2 cores, MiniLM-L6 and the DiaSafety+ConvAbuse test dialogues",
    }
    ratio = next((r["x_first"] for r in default.get("long_messages", []) if r["chars"] == 4000), None)
    if ratio is not None:
        out["long_4000_vs_500"] = {"value": ratio, "limit": TARGET_LONG_RATIO, "met": ratio <= TARGET_LONG_RATIO}
    return out


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    d = report["dialogues"]
    lines = [
        f"### Runtime benchmark: {report['model']} ({report['subject']})",
        "",
        f"{m['cpu']}, {report['threads']} threads, {m['clock_ghz']} GHz nominal, {m['isa']}: peak fp32 "
        f"{m['peak_gflops_isa']} GFLOP/s ({m['flop_per_cycle_isa']} FLOP/cycle/core; % of peak below), "
        f"{m['peak_gflops_avx2_fma']} at AVX2+FMA's 32. FLOPs = 2 x non-embedding params + 4 x layers x hidden x seq "
        "per real token (int8 counted as if fp32). "
        f"Load average {m['load_average_at_start']} → {m.get('load_average_at_end')}.",
        f"Dialogues: {report['data']}; {d['n']} dialogues, mean {d['mean_tokens']} tokens "
        f"(p50 {d['p50_tokens']}, p95 {d['p95_tokens']}, max {d['max_tokens']}).",
        "",
        "| engine | file MB | single p50 ms | single p99 ms | model-only p50 ms | sorted-64 ex/s | tokens/s "
        f"| budget-{report['max_batch_tokens']} ex/s | tokens/s | GFLOP/s | % of peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in report["engines"]:
        s, b, t = e["single"], e["sorted64"], e["token_budget"]
        best = max((b, t), key=lambda x: x["examples_per_s"])
        frac = best["fraction_of_peak"]
        lines.append(
            f"| {e['engine']}{' (CPU default)' if e['cpu_default'] else ''} | {e['file_mb'] or '—'} | {s['p50_ms']} "
            f"| {s['p99_ms']} | {s['model_only_p50_ms']} | {b['examples_per_s']} | {b['tokens_per_s']:.0f} "
            f"| {t['examples_per_s']} | {t['tokens_per_s']:.0f} | {best['useful_gflops_per_s'] or '—'} "
            f"| {'—' if frac is None else f'{100 * frac:.1f}%'} |"
        )
    ratio_tables = dict(report.get("ratios") or {})
    vs = ratio_tables.pop("served_vs_model", None)
    if vs is not None:
        lines += [
            "",
            f"Time per dialogue of {report['model']}'s served default against {vs['model']}'s (--vs; this run, "
            f"same dialogues, rounds interleaved): single p50 {vs['single_p50_x']}x, p99 {vs['single_p99_x']}x; "
            f"batched sorted-64 {vs['sorted64_time_x']}x, budget {vs['token_budget_time_x']}x",
        ]
    for key, table in ratio_tables.items():
        base = key.removeprefix("vs_")
        lines += [
            "",
            f"Ratios against {base} (this run; {report.get('naive_exporter', '')}): batched throughput x, "
            "single-dialogue p50 as a fraction",
            "",
            "| engine | sorted-64 x | budget x | single p50 fraction |",
            "|---|---|---|---|",
        ]
        for engine, r in table.items():
            lines.append(f"| {engine} | {r['sorted64_x']} | {r['token_budget_x']} | {r['single_p50_fraction']} |")
    if report["sweep"]:
        lens = sorted({c["seq_len"] for c in report["sweep"]})
        lines += [
            "",
            "Sweep (model only, synthetic ids): examples/s (% of peak) by batch size × sequence length",
            "",
            "| engine | batch | " + " | ".join(f"len {n}" for n in lens) + " |",
            "|---|---|" + "---|" * len(lens),
        ]
        rows: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        for c in report["sweep"]:
            rows.setdefault((c["engine"], c["batch"]), {})[c["seq_len"]] = c
        for (engine, batch), cells in rows.items():
            out = []
            for n in lens:
                c = cells.get(n)
                if c is None:
                    out.append("—")
                    continue
                frac = c["fraction_of_peak"]
                out.append(f"{c['examples_per_s']}" + ("" if frac is None else f" ({100 * frac:.1f}%)"))
            lines.append(f"| {engine} | {batch} | " + " | ".join(out) + " |")
    long_rows = [(e["engine"], r) for e in report["engines"] for r in e.get("long_messages", [])]
    if long_rows:
        lines += [
            "",
            "Long messages (one message, no history, every window read): p50 latency and cost per window",
            "",
            "| engine | characters | windows | model rows | tokens | p50 ms | ms per window | × 500 characters |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for engine, r in long_rows:
            lines.append(
                f"| {engine} | {r['chars']} | {r['windows']} | {r['rows']} | {r['tokens']} | {r['p50_ms']} "
                f"| {r['ms_per_window']} | {r['x_first']} |"
            )
    if report.get("ops"):
        lines += ["", *ops_markdown(report["ops"])]
    tg = report.get("targets", {})
    for key in ("batched_vs_naive_fp32", "single_p50_vs_naive_fp32", "int8_batched_vs_naive_int8"):
        if key in tg:
            lines.append(
                f"Target {key}: {tg[key]['value']} (limit {tg[key]['limit']}: {'met' if tg[key]['met'] else 'NOT met'})"
            )
    if "single_p50_ms" in tg:
        single, rate = tg["single_p50_ms"], tg["sorted64_examples_per_s"]
        lines += [
            "",
            f"Targets ({tg['variant']}): single p50 {single['value']} ms "
            f"(≤ {single['limit']}: {'met' if single['met'] else 'NOT met'}); "
            f"sorted-64 {rate['value']} ex/s (≥ {rate['limit']}: {'met' if rate['met'] else 'NOT met'})",
        ]
        if "long_4000_vs_500" in tg:
            long = tg["long_4000_vs_500"]
            lines[-1] += (
                f"; a 4,000-character message {long['value']}× a 500-character one "
                f"(≤ {long['limit']}: {'met' if long['met'] else 'NOT met'})"
            )
    lines += [f"- note: {n}" for n in report["notes"]]
    return "\n".join(lines)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    src = p.add_argument_group("what to benchmark (default: the bundled models/default)")
    src.add_argument("--model", type=Path, default=None, help="exported ONNX model directory")
    src.add_argument(
        "--checkpoint", type=Path, default=None, help="torch checkpoint (exported to a temp dir unless --model)"
    )
    src.add_argument("--geometry", default=None, help="random weights of a geometry: minilm-l6, bert-base, tiny")
    p.add_argument(
        "--variants",
        default="torch,naive-fp32,naive-int8,fp32,optimized,int8,int8-unchecked,fp16",
        help="engines (default: %(default)s); torch (eager), naive-fp32/naive-int8: torch.onnx.export and "
        "onnxruntime's quantize_dynamic with their defaults, of the model's checkpoint (--checkpoint, the card's "
        "source checkpoint when it exists, else one rebuilt from the model directory's weights); "
        "int8-unchecked: the int8 graph without the card's fp32 check of the dialogues it scores near the "
        "threshold (what the check costs)",
    )
    p.add_argument("--data-dir", default=None, help="data directory with the DiaSafety and ConvAbuse test splits")
    p.add_argument("--examples", type=int, default=None, help="dialogues in the realistic set at most")
    p.add_argument("--singles", type=int, default=None, help="single-dialogue predictions timed per engine")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")
    p.add_argument("--spin", choices=("default", "on", "off"), default="default", help="onnxruntime thread spinning")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=MAX_BATCH_TOKENS,
        help="padded tokens per batch in the budget policy (default: %(default)s, the service's)",
    )
    p.add_argument(
        "--one-pass",
        action="store_true",
        help="a decomposed model: also time the CPU default without its second pass over the utterances alone "
        "(what that pass costs)",
    )
    p.add_argument(
        "--vs",
        type=Path,
        default=None,
        metavar="MODEL",
        help="another exported model directory whose served default (its card's CPU variant) is timed in the same "
        "rounds: the ratio of time per dialogue (e.g. a new release against the previous one)",
    )
    p.add_argument(
        "--record-card",
        action="store_true",
        help="write this run's figures for fp32, optimized and int8 into the model card under this CPU's family "
        "(cpu_speed: the runtime serves the fastest variant that passes the gate for the family it runs on)",
    )
    p.add_argument("--no-sweep", action="store_true", help="skip the batch × length sweep")
    p.add_argument("--no-long", action="store_true", help="skip the long messages (500 to 16,000 characters)")
    p.add_argument(
        "--no-ops",
        action="store_true",
        help="skip where the time goes (onnxruntime's per-kernel profile: weight GEMMs against the rest, and the "
        "GEMM speed-up each ratio target needs)",
    )
    p.add_argument("--smoke", action="store_true", help="every step for a moment on a tiny model (tests)")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench runtime") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.geometry or args.checkpoint is not None or args.smoke:
        from dialogue_safety.extras import missing_distributions, missing_extra_message

        missing = missing_distributions("train")  # random weights and checkpoints are torch models
        if missing:
            print(missing_extra_message(f"{prog} --geometry/--checkpoint/--smoke", "train", missing), file=sys.stderr)
            return 2
    if args.geometry:
        from dialogue_safety.training.modeling import GEOMETRIES

        if args.geometry not in GEOMETRIES:
            print(f"{prog}: unknown geometry {args.geometry!r}; choose from {sorted(GEOMETRIES)}", file=sys.stderr)
            return 2
    variant_names = [v.strip() for v in args.variants.split(",") if v.strip()]
    allowed = {"torch", *NAIVE_ENGINES, "fp32", "optimized", "int8", UNCHECKED_INT8, "fp16"}
    if not variant_names or set(variant_names) - allowed:
        print(f"{prog}: --variants must name some of {sorted(allowed)}", file=sys.stderr)
        return 2
    problem = model_dir_problem(args.model) if args.model is not None else None
    if problem:
        print(f"{prog}: {problem} (dialogue-safety export writes one)", file=sys.stderr)
        return 2
    if args.checkpoint is not None:
        from dialogue_safety.training.checkpoint_layout import checkpoint_problem

        problem = checkpoint_problem(args.checkpoint)
        if problem:
            print(f"{prog}: {problem}", file=sys.stderr)
            return 2
    say: Callable[[str], None] = (lambda _: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))
    with subject_for(args, variant_names) as subject:
        if not is_model_dir(subject.model_dir):
            print(
                f"{prog}: no model directory at {subject.model_dir}; pass --model DIR, --checkpoint DIR or "
                "--geometry NAME (see dialogue-safety export)",
                file=sys.stderr,
            )
            return 2
        report = run(args, subject, variant_names, say)
    emit_report(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
