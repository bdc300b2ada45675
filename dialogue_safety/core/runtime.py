"""``OnnxClassifier``: the torch-free synchronous core of the service.

    clf = OnnxClassifier("models/default")            # CPU: cpu_default(card); CUDA: card.gpu_variant
    clf.predict([Example.from_texts("you're a clown", ["what do you think of me?"])])

It reads everything from the model directory (card, tokenizer, ONNX graph), encodes with the
one input contract (:mod:`dialogue_safety.core.encoding`), runs a call larger than one batch in length-sorted
batches under the one batching budget (:mod:`dialogue_safety.core.batch_budget`: padded tokens = batch size ×
longest; never padded to ``max_length``),
runs onnxruntime and returns predictions in the caller's order, with scores computed by
:mod:`dialogue_safety.core.scoring`. A variant missing from the directory is derived on first load
(:mod:`dialogue_safety.core.variants`). Nothing here imports torch, transformers, ``training`` or ``export``.

``predict``/``predict_encoded`` may be called from several threads at once
(``InferenceSession.run`` is thread-safe); the micro-batcher's inference workers each call
:meth:`OnnxClassifier.row_logits` on their own session, from a thread of their own.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core import language
from dialogue_safety.core.batch_budget import MAX_BATCH_SIZE, MAX_BATCH_TOKENS, fits, token_budget_batches
from dialogue_safety.core.cpu import cpu_family, cpu_has_vnni
from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample, pad_batch
from dialogue_safety.core.limits import MAX_WINDOWS
from dialogue_safety.core.model_card import TOKENIZER_FILE, ModelCard
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.core.scoring import (
    RowLogits,
    context_columns,
    decomposed_logits,
    head_probabilities,
    main_scores,
    near_thresholds,
    predictions_from_logits,
)

log = logging.getLogger("dialogue_safety.core.runtime")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


class _Background:
    """``fn()`` run in a thread now; :meth:`result` waits for it and raises what it raised."""

    def __init__(self, fn: Any) -> None:
        self._error: BaseException | None = None

        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to the caller of result()
                self._error = exc

        self._thread = threading.Thread(target=run, name="safety-load", daemon=True)
        self._thread.start()

    def result(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


def portable_int8(recipe: Mapping[str, Any]) -> bool:
    """Whether an int8 recipe computes the same on every CPU: 7-bit weights (``reduce_range``). With 8-bit
    weights, x86 CPUs without VNNI add u8*s8 products in saturating 16-bit pairs (AVX2 ``vpmaddubsw``: one integer
    MatMul of random 8-bit operands can be off by tens where 7-bit ones are exact)."""
    return bool(recipe.get("reduce_range", False))  # the quantisers' default too: 8-bit weights


def _int8_recipe(card: ModelCard) -> Mapping[str, Any]:
    recipe = (card.export.get("recipes") or {}).get("int8")
    if recipe is None:  # the card names none: the default recipe is derived (core.variants)
        from dialogue_safety.core.variants import recipe_for

        recipe = recipe_for("int8", card)
    return dict(recipe)


def int8_supported(card: ModelCard, cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether the card's int8 variant computes what its export validated on this CPU.

    A recipe with 8-bit weights (``reduce_range`` false) is exact only with VNNI; on an x86 CPU
    without it the u8*s8 products can saturate, so the validated F1 would not hold.
    """
    if portable_int8(_int8_recipe(card)):
        return True, "7-bit weights run the same on every CPU"
    if cpu_has_vnni(cpuinfo) is False:
        return False, "its 8-bit weights need VNNI (AVX512-VNNI or AVX-VNNI), which this CPU lacks"
    return True, "8-bit weights on a CPU with VNNI (or not x86)"


def exact_cpu_fallback(card: ModelCard) -> str:
    """The variant served instead of an int8 default this CPU cannot run as validated: the faster of
    fp32 and optimized (both compute fp32's scores) in the export's timings, optimized without them."""
    seconds = (card.export.get("comparison") or {}).get("seconds") or {}
    if "fp32" in seconds and "optimized" in seconds and float(seconds["fp32"]) < float(seconds["optimized"]):
        return "fp32"
    return "optimized"


def fastest_recorded(card: ModelCard, family: str, candidates: Sequence[str] | None = None) -> str | None:
    """Of ``candidates`` (default: the card's ``cpu_candidates``, the variants that pass the gate), the one with the
    most dialogues/s in the figures the card records for CPU family ``family``; the first on a tie, None when none
    of them has a figure for that family."""
    figures = (card.cpu_speed.get(family) or {}).get("variants") or {}
    measured = [v for v in (card.cpu_candidates if candidates is None else candidates) if v != "fp16"]
    measured = [v for v in measured if (figures.get(v) or {}).get("dialogues_per_s")]
    if not measured:
        return None
    return max(measured, key=lambda v: (float(figures[v]["dialogues_per_s"]), -measured.index(v)))


def cpu_default(card: ModelCard, cpuinfo: str | None = None) -> tuple[str, str]:
    """The CPU variant served when none is asked for, and why: of the variants that pass the decision gate
    (``card.cpu_candidates``) and compute here what was validated (:func:`int8_supported`), the one with the
    most dialogues/s in the figures the card records for this CPU's family (``card.cpu_speed``,
    :func:`dialogue_safety.core.cpu.cpu_family`). Without figures for this family (or on a card without
    candidates): the card's ``cpu_variant`` (the export machine's choice), or the exact fallback of an int8
    this CPU cannot run as validated (:func:`exact_cpu_fallback`). Recorded figures, not a measurement at start:
    the lab measures them (``python -m lab.bench runtime --record-card``)."""
    family = cpu_family(cpuinfo)
    int8_ok, int8_why = int8_supported(card, cpuinfo)
    candidates = [v for v in card.cpu_candidates if v != "int8" or int8_ok]
    best = fastest_recorded(card, family, candidates) if family else None
    if best is not None:
        figures = card.cpu_speed[str(family)]["variants"]
        speeds = ", ".join(f"{v} {float(figures[v]['dialogues_per_s']):g}" for v in candidates if v in figures)
        return best, f"the fastest variant that passes the gate on {family} (dialogues/s recorded: {speeds})"
    where = f"no figures recorded for {family}" if family else "a CPU family with no recorded figures"
    if card.cpu_variant == "int8" and not int8_ok:
        fallback = exact_cpu_fallback(card)
        return fallback, f"{where}; the card's int8 is not used: {int8_why}"
    return card.cpu_variant, f"{where}: the card's CPU default"


def cpu_defaults(card: ModelCard) -> list[str]:
    """Every variant :func:`cpu_default` may serve, on whichever CPU: the card's ``cpu_variant`` (and its exact
    fallback when it is an int8 that not every CPU runs as validated) and the fastest recorded for each family
    (what an image built for any CPU keeps: ``python -m dialogue_safety.core.variants DIR cpu --prune``)."""
    names = [card.cpu_variant]
    if card.cpu_variant == "int8" and not portable_int8(_int8_recipe(card)):
        names.append(exact_cpu_fallback(card))
    names += [v for family in sorted(card.cpu_speed) if (v := fastest_recorded(card, family)) is not None]
    return list(dict.fromkeys(names))


INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "logits"


class ModelLoadError(RuntimeError):
    """The model directory is missing, incomplete or corrupt, or the variant cannot run here."""


# -- threads -----------------------------------------------------------------------------------
def physical_cores() -> int:
    """Physical cores this process may use: CPU affinity, SMT siblings folded, cgroup quota applied."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores: set[str] = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            siblings = (topology / "core_cpus_list").read_text().strip()
        except OSError:
            try:
                siblings = (topology / "thread_siblings_list").read_text().strip()
            except OSError:
                siblings = str(cpu)
        cores.add(siblings)
    count = max(1, len(cores))
    quota = _cgroup_cpu_quota()
    return max(1, min(count, math.ceil(quota))) if quota else count


def _cgroup_cpu_quota() -> float | None:
    """CPUs granted by a cgroup v2 ``cpu.max`` quota (containers started with ``--cpus``), if any."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return float(quota) / float(period)
    except (ValueError, ZeroDivisionError):
        return None


def session_options(intra_op_threads: int | None = None, allow_spinning: bool | None = None) -> Any:
    """Latency-oriented settings: intra-op threads = physical cores, one inter-op thread, sequential."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads or physical_cores()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    if allow_spinning is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if allow_spinning else "0")
    return options


def cuda_available() -> bool:
    """onnxruntime-gpu is installed and an NVIDIA device is visible."""
    import onnxruntime as ort

    if CUDA not in ort.get_available_providers():
        return False
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()


# -- the classifier ----------------------------------------------------------------------------
class OnnxClassifier:
    """Predictions from an exported model directory with onnxruntime (no torch)."""

    def __init__(
        self,
        model_dir: str | Path,
        variant: str | None = None,
        providers: Sequence[str] | None = None,
        intra_op_threads: int | None = None,
        max_batch_tokens: int = MAX_BATCH_TOKENS,
        max_batch_size: int = MAX_BATCH_SIZE,
        *,
        max_windows: int | None = MAX_WINDOWS,
        language_check: bool = False,
        allow_spinning: bool | None = None,
        derive_in_subprocess: bool = False,
        int8_check: bool = True,
        thresholds: Sequence[float] = (),
        workers: int = 1,
    ) -> None:
        if max_batch_tokens < 1 or max_batch_size < 1:
            raise ValueError(
                f"max_batch_tokens and max_batch_size must be >= 1, got {max_batch_tokens}, {max_batch_size}"
            )
        self.model_dir = Path(model_dir)
        self.derive_in_subprocess = derive_in_subprocess  # the service: derivation memory is not kept
        self.max_batch_tokens = int(max_batch_tokens)
        self.max_batch_size = int(max_batch_size)
        self.max_windows = max_windows  # windows over one long utterance at most (None: all it needs)
        self.language_check = language_check  # say in each prediction which language the utterance is in
        # the detector's model is decompressed while the sessions load (both release the GIL): a start
        # otherwise waits for one and then the other
        detector = _Background(language.load) if language_check else None
        self.card = self._load_card()
        self.encoder = self._load_encoder()
        self.model_id = self.card.model_id
        self._n_heads = len(self.card.heads)
        self._context_cols = context_columns(self.card)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        # workers: sessions run side by side by the service's inference workers, the intra-op threads shared out
        threads = intra_op_threads or physical_cores()
        per_worker = max(1, threads // workers) if workers > 1 else intra_op_threads
        self.session, self.variant, self.provider, self.path = self._load_session(
            variant, providers, intra_op_threads, allow_spinning, cpu_threads=per_worker
        )
        self.workers = workers if self.provider == CPU else 1  # one device: one worker, with all the threads
        self.intra_op_threads = (per_worker or threads) if self.provider == CPU else threads  # each worker's
        # the workers that run side by side on cores of their own (the rest share cores, time-sliced)
        self.parallel = min(self.workers, max(1, physical_cores() // self.intra_op_threads))
        self._worker_sessions = [self.session] + [
            self._session(self.variant, [CPU], per_worker, allow_spinning)[0] for _ in range(self.workers - 1)
        ]
        self._input_names = [i.name for i in self.session.get_inputs()]
        self._check_signature()
        # the int8 check (ModelCard.int8_check_band): an fp32 session for the dialogues int8 scores near a threshold
        self.check_band = self.card.int8_check_band if int8_check and self.variant == "int8" else 0.0
        # the card's threshold and the ones decisions are made at instead (SAFETY_THRESHOLD, score --threshold)
        self.check_thresholds = tuple(sorted({self.card.threshold, *map(float, thresholds)}))
        self.checked_items = 0  # dialogues scored again with fp32 (read by the service's metrics)
        self._counting = threading.Lock()  # the service's workers add to checked_items side by side
        self._checker: Any = None
        if self.check_band > 0:
            # its threads do not spin after a run: spinning, they take the cores from the next int8 batch
            self._checker, _ = self._session("fp32", [CPU], intra_op_threads, False)
        if detector is not None:
            detector.result()  # raises LanguageCheckUnavailable when py3langid is missing

    # -- loading --
    def _load_card(self) -> ModelCard:
        if not self.model_dir.is_dir():
            raise ModelLoadError(
                f"{self.model_dir}: no model directory; export a checkpoint with "
                "`dialogue-safety export CHECKPOINT DIR`"
            )
        try:
            return ModelCard.load(self.model_dir)
        except (FileNotFoundError, ValueError) as exc:
            raise ModelLoadError(str(exc)) from exc

    def _load_encoder(self) -> DialogueEncoder:
        path = self.model_dir / TOKENIZER_FILE
        if not path.is_file():
            raise ModelLoadError(f"{self.model_dir}: no {TOKENIZER_FILE}; is it an exported model directory?")
        try:
            return DialogueEncoder.from_file(path, self.card.encoding_config)
        except Exception as exc:  # tokenizers raises plain Exception for unreadable files
            raise ModelLoadError(f"{path}: cannot load the tokenizer: {exc}") from exc

    def _load_session(
        self,
        variant: str | None,
        providers: Sequence[str] | None,
        intra_op_threads: int | None,
        allow_spinning: bool | None,
        cpu_threads: int | None,
    ) -> tuple[Any, str, str, Path]:
        """CUDA with the GPU variant when onnxruntime-gpu and a device are there (``intra_op_threads``), else CPU
        (``cpu_threads``: one worker's share of them)."""
        import onnxruntime as ort

        available = ort.get_available_providers()
        if providers:
            requested = list(providers)
            missing = [p for p in requested if p not in available]
            if missing:
                raise ModelLoadError(f"onnxruntime providers {missing} are not available here (available: {available})")
        else:
            requested = [CUDA, CPU] if cuda_available() else [CPU]
        if CUDA in requested and variant != "int8":  # dynamic int8 kernels are CPU kernels
            gpu_variant = variant or self.card.gpu_variant
            try:
                session, path = self._session(gpu_variant, [CUDA, CPU], intra_op_threads, allow_spinning)
            except ModelLoadError as exc:
                if variant is not None:
                    raise
                log.warning("no CUDA session (%s); running on CPU", exc)
            else:
                if session.get_providers()[0] == CUDA:
                    return session, gpu_variant, CUDA, path
                log.warning("onnxruntime did not place %s on CUDA; running on CPU", path.name)
        if CPU not in requested:
            raise ModelLoadError(f"could not start a session on {requested}")
        cpu_variant = variant
        if cpu_variant is None:
            cpu_variant, why = cpu_default(self.card)
            log.info("serving the %s variant on CPU: %s", cpu_variant, why)
        if cpu_variant == "fp16":
            raise ModelLoadError(
                "the fp16 variant is for CUDA; no CUDA device is usable here (pick fp32, optimized or int8)"
            )
        session, path = self._session(cpu_variant, [CPU], cpu_threads, allow_spinning)
        return session, cpu_variant, CPU, path

    def _session(
        self, variant: str, providers: list[str], intra_op_threads: int | None, allow_spinning: bool | None
    ) -> tuple[Any, Path]:
        import onnxruntime as ort

        try:
            from dialogue_safety.core import variants as variants_mod
        except ImportError as exc:  # onnx is part of the serve extra
            raise ModelLoadError(
                f"variants need the onnx package ({exc}): pip install 'dialogue-safety[serve]'"
            ) from exc
        ensure = variants_mod.ensure_variant_in_subprocess if self.derive_in_subprocess else variants_mod.ensure_variant
        try:
            path = ensure(self.model_dir, variant, self.card)
        except (variants_mod.VariantError, FileNotFoundError) as exc:
            raise ModelLoadError(f"{self.model_dir}: variant {variant!r}: {exc}") from exc
        except Exception as exc:  # a corrupt artifact fails inside onnx/onnxruntime tools
            raise ModelLoadError(f"{self.model_dir}: cannot derive variant {variant!r}: {exc}") from exc
        options = session_options(intra_op_threads, allow_spinning)
        try:
            session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:
            if path.name == variants_mod.ARTIFACT_FILE:
                raise ModelLoadError(f"{path}: onnxruntime cannot load it: {exc}") from exc
            log.warning("%s does not load (%s): deriving it again", path, exc)
            try:
                path = variants_mod.ensure_variant(self.model_dir, variant, self.card, force=True)
                session = ort.InferenceSession(str(path), options, providers=providers)
            except Exception as exc2:
                raise ModelLoadError(f"{path}: onnxruntime cannot load it: {exc2}") from exc2
        return session, path

    def _check_signature(self) -> None:
        names = set(self._input_names)
        if not names or not names <= set(INPUT_NAMES) or "input_ids" not in names:
            raise ModelLoadError(f"{self.path}: unexpected inputs {sorted(names)}; expected a subset of {INPUT_NAMES}")
        outputs = self.session.get_outputs()
        if not outputs or outputs[0].name != OUTPUT_NAME:
            raise ModelLoadError(
                f"{self.path}: the first output must be {OUTPUT_NAME!r}, got {[o.name for o in outputs]}"
            )
        width = outputs[0].shape[-1] if outputs[0].shape else None
        if isinstance(width, int) and width != self._n_heads:
            raise ModelLoadError(f"{self.path}: {width} logits per example but the card names {self._n_heads} heads")

    # -- inference --
    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        """Model inputs of ``examples``: a long utterance in windows, ``max_windows`` at most (what the
        cap leaves unread is in each :attr:`EncodedExample.read` and then in the prediction; with
        ``language_check``, so is the utterance's language: :mod:`dialogue_safety.core.language`)."""
        encoded = self.encoder.encode_batch(examples, self.max_windows)
        if not self.language_check:
            return encoded
        out: list[EncodedExample] = []
        seen: dict[str, language.Language] = {}  # an explanation's occlusions share their sample of the text
        for example, e in zip(examples, encoded, strict=True):
            sample = example.utterance[: language.SAMPLE_CHARS]
            found = seen.get(sample) or seen.setdefault(sample, language.detect(sample))
            out.append(replace(e, read=replace(e.read, language=found.code, language_supported=found.supported)))
        return out

    def batches(self, encoded: Sequence[EncodedExample]) -> Iterator[np.ndarray]:
        """Index arrays of the batches :meth:`logits_encoded` runs over rows (each window of a long
        utterance is a row of its own: :func:`dialogue_safety.core.scoring.decomposed_logits` passes
        them): one batch in the caller's order when the rows fit the budget (the micro-batcher's
        batches often do), else longest first, cut by :func:`dialogue_safety.core.batch_budget.token_budget_batches`."""
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        if fits(len(encoded), int(lengths.max(initial=0)), self.max_batch_tokens, self.max_batch_size):
            return iter([np.arange(len(encoded))])
        return token_budget_batches(lengths, self.max_batch_tokens, self.max_batch_size)

    def run_batch(self, encoded: Sequence[EncodedExample], session: Any = None, cancel: Any = None) -> np.ndarray:
        """[n, heads] float32 logits of one batch, padded to its longest example (``cancel``: a
        :meth:`cancel_token` that stops the run when set)."""
        feeds = pad_batch(encoded, self.encoder.pad_id)
        if len(self._input_names) != len(feeds):
            feeds = {k: feeds[k] for k in self._input_names}
        out = (session or self.session).run([OUTPUT_NAME], feeds, cancel)[0]
        return np.asarray(out, dtype=np.float32).reshape(len(encoded), self._n_heads)

    def logits_encoded(self, encoded: Sequence[EncodedExample], run: RowLogits | None = None) -> np.ndarray:
        """[n, heads] float32 logits in the caller's order (a decomposed model's utterance heads from
        a second, short pass over the utterances alone). With the int8 check, the dialogues whose
        score lies within :attr:`check_band` of a threshold in :attr:`check_thresholds` get fp32's logits.
        ``run``: the rows' logits when they were run already (:meth:`predict_scored`)."""
        logits = decomposed_logits(encoded, run or self._row_logits, self._context_cols)
        if self._checker is None or not len(encoded):
            return logits
        scores = main_scores(head_probabilities(logits, self.card), self.card)
        idx = np.flatnonzero(near_thresholds(scores, self.check_thresholds, self.check_band))
        if idx.size:
            near_rows = [encoded[i] for i in idx.tolist()]
            logits[idx] = decomposed_logits(near_rows, lambda r: self._row_logits(r, self._checker), self._context_cols)
            with self._counting:
                self.checked_items += int(idx.size)
        return logits

    def _row_logits(self, encoded: Sequence[EncodedExample], session: Any = None, cancel: Any = None) -> np.ndarray:
        n = len(encoded)
        if n == 0:
            return np.zeros((0, self._n_heads), dtype=np.float32)
        if fits(n, max(len(e) for e in encoded), self.max_batch_tokens, self.max_batch_size):
            return self.run_batch(encoded, session, cancel)  # one batch (the micro-batcher's always are)
        out = np.empty((n, self._n_heads), dtype=np.float32)
        for idx in self.batches(encoded):
            out[idx] = self.run_batch([encoded[i] for i in idx], session, cancel)
        return out

    # -- rows: what the micro-batcher schedules (dialogue_safety.service.batcher) --
    def row_logits(self, rows: Sequence[EncodedExample], worker: int = 0, cancel: Any = None) -> np.ndarray:
        """[len(rows), heads] logits of model rows, each run as it is (a window or an utterance-alone row of
        any example: :attr:`EncodedExample.model_rows`), in the caller's order, on ``worker``'s session (one
        of :attr:`workers`; each may run beside the others). ``cancel``: a :meth:`cancel_token`; once set, the
        run stops and raises."""
        return self._row_logits(rows, self._worker_sessions[worker], cancel)

    @staticmethod
    def cancel_token() -> Any:
        """A token for :meth:`row_logits` that another thread may set (``token.terminate = True``) to stop the run."""
        import onnxruntime as ort

        return ort.RunOptions()

    def predict_scored(
        self, encoded: Sequence[EncodedExample], scored: RowLogits, threshold: float | None = None
    ) -> list[Prediction]:
        """:meth:`predict_encoded` of examples whose rows were run already: ``scored`` maps rows to their
        logits (what :meth:`row_logits` gave them, whichever calls they were run in); combined as
        :meth:`predict_encoded` combines them, the int8 check included."""
        if not encoded:
            return []
        logits = self.logits_encoded(encoded, scored)
        return predictions_from_logits(logits, self.card, threshold, [e.read for e in encoded])

    def logits(self, examples: Sequence[Example]) -> np.ndarray:
        return self.logits_encoded(self.encode(examples)) if examples else self.logits_encoded([])

    def predict_encoded(self, encoded: Sequence[EncodedExample], threshold: float | None = None) -> list[Prediction]:
        if not encoded:
            return []
        return predictions_from_logits(self.logits_encoded(encoded), self.card, threshold, [e.read for e in encoded])

    def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]:
        """One :class:`Prediction` per example, in the caller's order."""
        if not examples:
            return []
        return self.predict_encoded(self.encode(examples), threshold)

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        """[n] main OFFENSIVE scores (max over the card's score heads), for evaluation code."""
        if not examples:
            return np.zeros(0, dtype=np.float64)
        return self.scores_encoded(self.encode(examples))

    def scores_encoded(self, encoded: Sequence[EncodedExample]) -> np.ndarray:
        """[n] main OFFENSIVE scores of encoded examples (as :meth:`predict_proba`)."""
        return main_scores(head_probabilities(self.logits_encoded(encoded), self.card), self.card)

    def warmup(self, rounds: int = 1) -> float:
        """Run a short and a full-length dialogue so that the first request does not pay the session's
        first-run costs (memory arena, kernel set-up); returns seconds taken. One of each is enough for
        that: a full batch is left out, it costs as much as serving one and would be paid on every start
        (the batcher's first full batch grows the arena once, by allocation only)."""
        started = time.perf_counter()
        short = Example.from_texts("hello there", ["hi"])
        long = Example.from_texts(" ".join(["word"] * 400), ["context " * 100])
        rows = [row for encoded in self.encode([short, long]) for row in encoded.model_rows]
        for _ in range(rounds):
            self.predict([short])
            self.predict([long])
            for worker in range(1, self.workers):  # the other workers' sessions too
                self.row_logits(rows, worker)
        return time.perf_counter() - started

    def __repr__(self) -> str:
        check = f", int8 check band {self.check_band}" if self._checker is not None else ""
        where = f"variant={self.variant}, provider={self.provider}, path={self.path}"
        return f"OnnxClassifier({self.model_id}, {where}{check})"
