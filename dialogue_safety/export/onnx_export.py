"""Checkpoint → self-describing ONNX model directory, checked against torch before anything is written.

    from dialogue_safety.export.onnx_export import export_checkpoint
    result = export_checkpoint("checkpoints/default", "models/default", ship=True, test_sets=tests)

Steps (all in a staging folder next to ``out_dir``; ``out_dir`` is replaced only on success):

1. load the checkpoint (``dialogue_safety.training.checkpoint``); with ``ship=True`` round every weight to fp16
   (so the parity check runs against exactly the weights that are shipped);
2. export with optimum (``optimum.exporters.onnx.export``, the model's ``text-classification``
   ONNX config): inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64,
   ``[batch_size, sequence_length]``), output ``logits`` ``[batch_size, n_heads]``;
   with ``ship=True`` store the weights as fp16 + Cast
   (:func:`dialogue_safety.core.variants.graphs.store_weights_fp16`);
3. **parity**: encode a fixed set of dialogues (different lengths, with and without history,
   truncated, emoji) with the checkpoint's tokenizer and card encoding, run torch and
   onnxruntime on one padded batch and on each dialogue alone, and raise :class:`ParityError`
   (max abs diff in the message) if any logit differs by more than ``tolerance`` or, when larger, its
   fp32 order allowance (:func:`torch_reference`: how far two correct fp32 kernels may differ);
4. derive the requested variants with :mod:`dialogue_safety.core.variants` (exactly as the service will) and
   check each against torch: fp32 within ``tolerance``, optimized within
   ``max(tolerance, OPTIMIZED_TOLERANCE)``; with validation sets, the int8 recipe is chosen first
   (:mod:`dialogue_safety.export.quantization`: a calibration set written to the model directory, the
   candidate recipes judged on validation, the cheapest to serve of those that pass kept); int8's
   differences are recorded, its quality is judged by :mod:`dialogue_safety.export.comparison` on
   labelled test sets, which picks ``card.cpu_variant``;
5. write ``model.onnx``, ``tokenizer.json``, ``model_card.json`` (the checkpoint's card with
   ``variants``, ``cpu_variant`` and ``export`` filled in) and ``MODEL_CARD.md``.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from dialogue_safety.core import variants
from dialogue_safety.core.cpu import cpu_family
from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample, pad_batch
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import (
    CARD_MARKDOWN_FILE,
    DERIVED_PATTERNS,
    TOKENIZER_FILE,
    VARIANT_FILES,
    is_model_dir,
)
from dialogue_safety.core.schema import Example, LabelledExample
from dialogue_safety.core.variants.graphs import quiet_loggers, store_weights_fp16
from dialogue_safety.core.variants.stamps import file_sha256, save_atomic, set_meta
from dialogue_safety.export.settings import DEFAULT_OPSET, DEFAULT_TOLERANCE, DEFAULT_VARIANTS

log = logging.getLogger("dialogue_safety.export")

OPTIMIZED_TOLERANCE = 1e-3  # fused attention/GELU/LayerNorm kernels accumulate in another order


class ExportError(RuntimeError):
    """The checkpoint cannot be exported (bad input, unsupported model, output not writable)."""


class ParityError(ExportError):
    """onnxruntime and torch disagree by more than the tolerance; nothing was written."""

    def __init__(self, what: str, max_abs_diff: float, tolerance: float, detail: str = "") -> None:
        self.what, self.max_abs_diff, self.tolerance = what, max_abs_diff, tolerance
        super().__init__(
            f"{what}: max |onnx - torch| logit difference {max_abs_diff:.3g} exceeds the tolerance "
            f"{tolerance:.3g}{'; ' + detail if detail else ''}. Nothing was written."
        )


@dataclass
class ExportResult:
    out_dir: Path
    card: ModelCard
    max_abs_diff: float
    variant_files: dict[str, Path] = field(default_factory=dict)
    comparison: dict[str, Any] | None = None


# -- the fixed parity batch ----------------------------------------------------------------------
def parity_examples() -> list[Example]:
    """Dialogues of different lengths, with and without history, one truncated, with emoji."""
    long_turn = "this is a rather long turn of dialogue that keeps going and going " * 12
    return [
        Example.from_texts("you are an idiot"),
        Example.from_texts("thanks, that was really helpful!"),
        Example.from_texts("ok"),
        Example.from_texts("honestly it tastes like garbage", ["what do you think of my cooking?"]),
        Example.from_texts(
            "people like you should not be allowed to vote",
            ["hi there", "hello! how are you today?", "fine. what do you think about the election?"],
        ),
        Example.from_texts("🐍 go back to where you came from 🤬", ["where are you from?"]),
        Example.from_texts(long_turn, ["short context"]),
        Example.from_texts("i agree with you", [long_turn, "and another turn " * 30, "what do you say?"]),
        Example.from_texts("Ça va? Très bien, merci — ñandú 123!!!", ["Comment ça va ?"]),
        Example.from_texts("women are worse at maths than men", ["tell me a fact", "sure, what topic?", "science"]),
    ]


def encode_parity_batch(encoder: DialogueEncoder, examples: Sequence[Example] | None = None) -> list[EncodedExample]:
    return encoder.encode_batch(list(examples or parity_examples()))


# -- torch side ----------------------------------------------------------------------------------
def torch_logits(model: torch.nn.Module, encoded: Sequence[EncodedExample], pad_id: int) -> np.ndarray:
    return torch_reference(model, encoded, pad_id)[0]


# How far two correct fp32 implementations of the same network may differ. Every kernel (torch's,
# onnxruntime's MLAS, with or without AVX-512/VNNI) sums its products in its own order, and each
# order rounds differently. The rounding errors of a length-n sum grow like sqrt(n)·u relative to
# the sum of the magnitudes of its terms (u: fp32 unit roundoff; n·u is the worst case, sqrt(n)
# times looser). A logit is the head's sum over the hidden size H of terms computed through L
# layers, whose longest sums run over the intermediate size K; LayerNorm re-normalises the residual
# stream after each layer, so the layers' relative errors add rather than multiply. The allowance
# is therefore relative to the magnitude of the head's terms (sum |w_i·h_i| + |b|), not to the
# logit: a logit near 0 can be the difference of large terms (measured: ~1400 for a logit of 2.3
# in the tests' rescaled tiny head), and it is those terms that carry the rounding error.
FP32_UNIT_ROUNDOFF = float(np.finfo(np.float32).eps) / 2


def fp32_order_factor(geometry: Mapping[str, int]) -> float:
    """Relative difference (per unit of head-term magnitude) two fp32 kernels may show on this model:
    u·(sqrt(H) + L·sqrt(K)) for the head's sum and the L layers' longest sums (see above)."""
    hidden = int(geometry.get("hidden_size", 768))
    layers = int(geometry.get("num_hidden_layers", 12))
    inner = int(geometry.get("intermediate_size", 4 * hidden))
    return FP32_UNIT_ROUNDOFF * (math.sqrt(hidden) + layers * math.sqrt(inner))


def head_linear(model: torch.nn.Module) -> torch.nn.Linear:
    """The layer that writes the logits: the last Linear with one output per head."""
    n = int(getattr(model, "config").num_labels)  # noqa: B009  (a Hugging Face model: typed as a plain Module)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == n]
    if not linears:
        raise ExportError(f"no Linear layer with {n} outputs writes the logits of {type(model).__name__}")
    return linears[-1]


def torch_reference(
    model: torch.nn.Module, encoded: Sequence[EncodedExample], pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(logits, allowance): torch's logits on one padded batch and, per logit, how far another
    correct fp32 kernel may differ from them (:func:`fp32_order_factor` x the head's term magnitude)."""
    batch = pad_batch(encoded, pad_id)
    head = head_linear(model)
    seen: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        with torch.inference_mode():
            out = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits
    finally:
        hook.remove()
    with torch.inference_mode():
        magnitude = seen[-1].abs().float() @ head.weight.detach().abs().float().T
        if head.bias is not None:
            magnitude = magnitude + head.bias.detach().abs().float()
    allowance = fp32_order_factor(_geometry(model)) * magnitude.cpu().numpy()
    return out.float().cpu().numpy(), allowance.astype(np.float32)


def round_weights_to_fp16(model: torch.nn.Module) -> int:
    """Round every floating-point parameter and buffer to the nearest fp16 value (kept in fp32)."""
    count = 0
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.copy_(tensor.half().float())
                count += 1
    return count


def export_torch_to_onnx(model: torch.nn.Module, path: Path, opset: int = DEFAULT_OPSET) -> None:
    """optimum's exporter with the model's ``text-classification`` ONNX config (dynamic batch/sequence)."""
    from optimum.exporters.onnx import export as optimum_export
    from optimum.exporters.tasks import TasksManager

    try:
        constructor = TasksManager.get_exporter_config_constructor(
            "onnx", model=model, task="text-classification", library_name="transformers"
        )
    except (KeyError, ValueError) as exc:
        raise ExportError(f"optimum cannot export {type(model).__name__} for text-classification: {exc}") from exc
    onnx_config = constructor(model.config)
    with warnings.catch_warnings(), quiet_loggers("optimum", "torch.onnx"):
        warnings.simplefilter("ignore")
        optimum_export(model.eval(), onnx_config, path, opset=opset)


# -- onnxruntime side ----------------------------------------------------------------------------
def ort_logits(
    path: Path, encoded: Sequence[EncodedExample], pad_id: int, providers: list[str] | None = None
) -> np.ndarray:
    """Logits of one padded batch from a fresh CPU session (what the service will run)."""
    import onnxruntime as ort

    from dialogue_safety.core.runtime import session_options

    session = ort.InferenceSession(str(path), session_options(), providers=providers or ["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feeds = {k: v for k, v in pad_batch(encoded, pad_id).items() if k in names}
    return np.asarray(session.run(["logits"], feeds)[0], dtype=np.float32)


def check_parity(
    what: str,
    path: Path,
    reference: np.ndarray,
    encoded: Sequence[EncodedExample],
    pad_id: int,
    tolerance: float | None,
    providers: list[str] | None = None,
    allowance: np.ndarray | None = None,
) -> dict[str, float]:
    """Max abs logit difference vs ``reference`` on one padded batch and on each example alone.

    Raises :class:`ParityError` where a logit differs by more than ``tolerance`` or, when larger, its
    fp32 order ``allowance`` (:func:`torch_reference`); ``tolerance=None`` only measures.
    """
    batch = ort_logits(path, encoded, pad_id, providers)
    singles = np.concatenate([ort_logits(path, [e], pad_id, providers) for e in encoded]) if len(encoded) > 1 else batch
    if batch.shape != reference.shape:
        raise ParityError(
            what, float("inf"), tolerance or 0.0, f"logits shape {batch.shape} != torch {reference.shape}"
        )
    batch_diff = float(np.max(np.abs(batch - reference)))
    single_diff = float(np.max(np.abs(singles - reference)))
    worst = max(batch_diff, single_diff)
    diff = np.maximum(np.abs(batch - reference), np.abs(singles - reference))
    allowed = None if tolerance is None else np.maximum(tolerance, 0.0 if allowance is None else allowance)
    if not np.isfinite(worst) or (allowed is not None and bool(np.any(diff > allowed))):
        over = diff if allowed is None else diff / allowed
        row, col = (int(i) for i in np.unravel_index(int(np.nanargmax(over)), over.shape))
        raise ParityError(
            what,
            worst,
            tolerance if tolerance is not None else float("nan"),
            f"batch {batch_diff:.3g}, one by one {single_diff:.3g}; worst example #{row} ({len(encoded[row])} tokens)"
            + ("" if allowed is None else f", its logit {col} allowed {float(allowed[row, col]):.3g} (fp32 order)"),
        )
    measured = {"max_abs_diff": worst, "batch_max_abs_diff": batch_diff, "single_max_abs_diff": single_diff}
    if allowance is not None:
        measured["order_allowance_max"] = float(np.max(allowance))
    return measured


# -- the export ----------------------------------------------------------------------------------
def _geometry(model: torch.nn.Module) -> dict[str, int]:
    config = model.config
    keys = (
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "type_vocab_size",
        "num_labels",
    )
    geometry = {k: int(getattr(config, k)) for k in keys if hasattr(config, k)}
    geometry["parameters"] = int(sum(p.numel() for p in model.parameters()))
    embeddings = getattr(getattr(model, "bert", None), "embeddings", None)
    if embeddings is not None:
        geometry["embedding_parameters"] = int(sum(p.numel() for p in embeddings.parameters()))
    return geometry


def _versions() -> dict[str, str]:
    import onnxruntime
    import optimum.version
    import transformers

    return {
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "optimum": optimum.version.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def _staging_dir(out_dir: Path) -> Path:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.export-", dir=out_dir.parent))
    os.chmod(staging, 0o755)  # mkdtemp makes it private; a model directory is meant to be read by the service
    return staging


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not is_model_dir(out_dir):
        raise ExportError(f"{out_dir} is not empty and is not a model directory; refusing to replace it")


def _replace_dir(staging: Path, out_dir: Path) -> None:
    """Swap the staging folder in for ``out_dir`` (renames only; the old one is removed last)."""
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rmdir(old)
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    variant_names: Sequence[str] = DEFAULT_VARIANTS,
    tolerance: float = DEFAULT_TOLERANCE,
    ship: bool = False,
    opset: int = DEFAULT_OPSET,
    test_sets: Mapping[str, Sequence[LabelledExample]] | None = None,
    recipes: Mapping[str, Mapping[str, Any]] | None = None,
    validation_sets: Mapping[str, Sequence[LabelledExample]] | None = None,
    int8_candidates: Sequence[str] | None = None,
    categories_data_dir: Path | None = None,
) -> ExportResult:
    """Export ``checkpoint`` to the model directory ``out_dir`` (see the module docstring).

    ``categories_data_dir``: the data directory whose validation splits of the checkpoint's training sources
    tune each category's threshold (:mod:`dialogue_safety.export.categories`, written to ``card.categories``);
    None: the card keeps none (every head is judged at the card's threshold).

    ``validation_sets`` (split name → labelled examples) give the static int8 variant its calibration
    set (written to the model directory) and judge the ``int8_candidates`` (preset names of
    :data:`dialogue_safety.core.variants.INT8_PRESETS`): of those that pass the gate on the held-out
    validation dialogues, the cheapest to serve becomes the int8 recipe (:mod:`dialogue_safety.export.quantization`).

    ``test_sets`` maps a split name (e.g. ``"diasafety/test"``) to labelled examples; with it,
    every CPU variant is compared with fp32 (decision agreement, ΔF1 with a paired bootstrap interval)
    and int8 becomes ``card.cpu_variant`` only if it passes the gate of :mod:`dialogue_safety.export.comparison`.
    ``recipes`` overrides :data:`dialogue_safety.core.variants.DEFAULT_RECIPES` (recorded in the card).
    Raises :class:`ParityError` (nothing written) when ONNX and torch disagree.
    """
    from dialogue_safety.training.checkpoint import load_checkpoint

    unknown = [v for v in variant_names if v not in variants.VARIANT_NAMES]
    if unknown:
        raise ExportError(f"unknown variants {unknown}; choose from {', '.join(variants.VARIANT_NAMES)}")
    if not tolerance > 0:
        raise ExportError(f"tolerance must be positive, got {tolerance}")
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    _check_out_dir(out_dir)
    try:
        model, encoder, source_card = load_checkpoint(checkpoint)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{checkpoint}: cannot load the checkpoint: {exc}") from exc
    if int(model.config.num_labels) != len(source_card.heads):
        raise ExportError(
            f"{checkpoint}: the model has {model.config.num_labels} logits but the card names "
            f"{len(source_card.heads)} heads {source_card.heads}"
        )
    encoded = encode_parity_batch(encoder)
    pad_id = encoder.pad_id
    export_info: dict[str, Any] = {}
    if ship:
        original = torch_logits(model, encoded, pad_id)
        round_weights_to_fp16(model)
        reference, allowance = torch_reference(model, encoded, pad_id)
        export_info["fp16_rounding_max_abs_diff"] = float(np.max(np.abs(reference - original)))
    else:
        reference, allowance = torch_reference(model, encoded, pad_id)

    staging = _staging_dir(out_dir)
    try:
        result = _export_into(
            staging,
            model,
            encoder,
            source_card,
            checkpoint,
            encoded,
            reference,
            allowance,
            export_info,
            variant_names=variant_names,
            tolerance=tolerance,
            ship=ship,
            opset=opset,
            test_sets=test_sets,
            recipes=recipes,
            validation_sets=validation_sets,
            int8_candidates=int8_candidates,
            categories_data_dir=categories_data_dir,
        )
        _replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.out_dir = out_dir
    result.variant_files = {k: out_dir / v.name for k, v in result.variant_files.items()}
    return result


def _export_into(
    staging: Path,
    model: torch.nn.Module,
    encoder: DialogueEncoder,
    source_card: ModelCard,
    checkpoint: Path,
    encoded: list[EncodedExample],
    reference: np.ndarray,
    allowance: np.ndarray,
    export_info: dict[str, Any],
    *,
    variant_names: Sequence[str],
    tolerance: float,
    ship: bool,
    opset: int,
    test_sets: Mapping[str, Sequence[LabelledExample]] | None,
    recipes: Mapping[str, Mapping[str, Any]] | None,
    validation_sets: Mapping[str, Sequence[LabelledExample]] | None = None,
    int8_candidates: Sequence[str] | None = None,
    categories_data_dir: Path | None = None,
) -> ExportResult:
    from dialogue_safety.export.card_markdown import render_model_card
    from dialogue_safety.export.comparison import choose_cpu_variant, compare_variants, passing_variants, speed_figures
    from dialogue_safety.export.quantization import (
        calibration_split,
        candidate_recipes,
        select_int8_recipe,
        write_calibration,
    )

    pad_id = encoder.pad_id
    artifact = staging / variants.ARTIFACT_FILE
    raw = staging / ".torch-export.onnx"
    export_torch_to_onnx(model, raw, opset)
    graph = onnx.load(str(raw))
    raw.unlink()
    converted = 0
    if ship:
        graph, converted = store_weights_fp16(graph)
    graph.producer_name = "dialogue-safety export"
    set_meta(graph, {"model_id": source_card.model_id, "weights_storage": "fp16" if ship else "fp32"})
    onnx.checker.check_model(graph)
    save_atomic(graph, artifact)
    del graph
    parity = check_parity(variants.ARTIFACT_FILE, artifact, reference, encoded, pad_id, tolerance, allowance=allowance)

    shutil.copyfile(checkpoint / TOKENIZER_FILE, staging / TOKENIZER_FILE)
    all_recipes = {name: dict(variants.DEFAULT_RECIPES[name]) for name in variants.VARIANT_NAMES}
    for name, recipe in (recipes or {}).items():
        all_recipes[name] = dict(recipe)
    files = {name: VARIANT_FILES[name] for name in variants.VARIANT_NAMES}
    if not ship:
        files["fp32"] = variants.ARTIFACT_FILE
    card = source_card.model_copy(deep=True)
    card.variants = files
    card.export = {
        "artifact": variants.ARTIFACT_FILE,
        "artifact_sha256": file_sha256(artifact),
        "artifact_bytes": artifact.stat().st_size,
        "weights_storage": "fp16" if ship else "fp32",
        "fp16_initializers": converted,
        "opset": opset,
        "tolerance": tolerance,
        "max_abs_diff": parity["max_abs_diff"],
        "parity": {"examples": len(encoded), **parity, "reference": "torch fp32 (weights as shipped)"},
        **export_info,
        **_versions(),
        "geometry": _geometry(model),
        "recipes": all_recipes,
        "source_checkpoint": str(checkpoint),
        "exported_at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
    }
    card.save(staging)  # variants.ensure_variant reads the recipes from it

    int8_validated = True  # int8 may be the CPU default (the test splits still have to pass it)
    if validation_sets:
        calibration, held_out = calibration_split(validation_sets)
        card.export["calibration"] = write_calibration(staging, encoder, calibration)
    else:
        held_out = {}
    if "int8" in variant_names and int8_candidates:
        candidates, notes = candidate_recipes(int8_candidates, card.export.get("calibration"))
        if candidates:
            selection = select_int8_recipe(staging, card, candidates, held_out)
            if notes:
                selection["notes"] = notes
            card.export["int8_selection"] = selection
            int8_validated = bool(selection["passed"]) or not held_out
        card.save(staging)

    variant_report: dict[str, dict[str, Any]] = {}
    variant_files: dict[str, Path] = {}
    for name in variant_names:
        path = variants.ensure_variant(staging, name, card)
        variant_files[name] = path
        entry: dict[str, Any] = {"file": path.name, "bytes": path.stat().st_size}
        limit = {"fp32": tolerance, "optimized": max(tolerance, OPTIMIZED_TOLERANCE)}.get(name)
        if name == "fp16":
            entry.update(_check_fp16(path, reference, encoded, pad_id))
        else:
            entry.update(check_parity(f"variant {name}", path, reference, encoded, pad_id, limit, allowance=allowance))
            entry["tolerance"] = limit
        variant_report[name] = entry
    card.export["variants"] = variant_report
    # the channels the int8 split computes apart, as chosen here: a first start of the service derives the
    # same graph without running it over the calibration rows again (core.variants.OUTLIER_CHOICE)
    if "int8" in variant_files and variants.record_outlier_choice(staging, "int8", card):
        card.save(staging)

    comparison = None
    cpu_candidates = [v for v in variant_names if v != "fp16"]
    if test_sets:
        comparison = compare_variants(staging, test_sets, variant_names=cpu_candidates)
        card.export["comparison"] = comparison
    eligible = [v for v in cpu_candidates if v != "int8" or int8_validated]
    card.cpu_variant, reason = choose_cpu_variant(comparison, eligible)
    # the variants the runtime may serve, and this machine's figures for them: another CPU family's are
    # measured by the lab (python -m lab.bench runtime --record-card) and picked by the runtime at load
    card.cpu_candidates = passing_variants(comparison, eligible)
    family = cpu_family()
    figures = speed_figures(comparison, card.cpu_candidates)
    if family is not None and figures:
        card.cpu_speed = {
            family: {
                "variants": figures,
                "measured": f"the export, scoring the test splits ({card.export['exported_at']})",
            }
        }
    if not int8_validated:
        reason += "; no int8 recipe passed the gate on the validation splits (export.int8_selection)"
    card.export["cpu_variant_reason"] = reason
    if "fp16" not in variant_names:
        card.gpu_variant = "optimized" if "optimized" in variant_names else "fp32"
    if categories_data_dir is not None:
        from dialogue_safety.export.categories import categories_for
        from dialogue_safety.export.categories import validation_sets as category_sets

        card.save(staging)  # the fp32 variant is read through the runtime, with this card
        found = category_sets([str(s) for s in card.training.get("sources") or []], categories_data_dir)
        if found:
            card.categories = categories_for(staging, found)
    card.save(staging)
    (staging / CARD_MARKDOWN_FILE).write_text(render_model_card(card), encoding="utf-8")
    if ship:
        # only model.onnx, tokenizer.json and the cards are meant to be committed
        (staging / ".gitignore").write_text(
            "# derived from model.onnx by dialogue_safety/core/variants (first start of the service)\n"
            + "".join(f"{pattern}\n" for pattern in DERIVED_PATTERNS),
            encoding="utf-8",
        )
    return ExportResult(staging, card, parity["max_abs_diff"], variant_files, comparison)


def _check_fp16(path: Path, reference: np.ndarray, encoded: Sequence[EncodedExample], pad_id: int) -> dict[str, Any]:
    """fp16 is served on CUDA; measure it there when a GPU is usable, else on onnxruntime's CPU kernels.

    Only recorded (fp16 logits legitimately move by ~1e-2); non-finite logits still fail the export.
    """
    from dialogue_safety.core.runtime import CPU, CUDA, cuda_available

    providers = [CUDA, CPU] if cuda_available() else [CPU]
    measured = check_parity("variant fp16", path, reference, encoded, pad_id, None, providers=providers)
    return {**measured, "checked_on": providers[0], "tolerance": None}
