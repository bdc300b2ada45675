"""Choosing the int8 variant at export: the calibration set it is derived from, and the recipe, by the gate.

    calibration = calibration_split(validation_sets)                 # {source: (calibration, held_out)}
    write_calibration(model_dir, encoder, calibration)               # model_dir/calibration.npz
    selection = select_int8_recipe(model_dir, card, candidates, held_out)

The calibration rows are a few hundred validation dialogues, :data:`CALIBRATION_PER_SOURCE` from each
source (seeded), encoded as the runtime encodes them (both rows of a ``"decomposed"`` encoding) and
stored in the model directory, so that the service derives the static int8 variant at start without
the datasets. Every int8 recipe given (``INT8_CANDIDATES``) is derived
and judged against fp32 by :func:`dialogue_safety.export.comparison.gate` on the *held-out* validation
dialogues (never the calibration ones), alone and with the fp32 check of the dialogues it scores near
the threshold (the narrowest band that passes, :func:`check_band_for`), and refused if its scores move
with the batch (:func:`batch_dependence`); of those that pass, the cheapest to serve
(:func:`served_seconds`: its seconds on those dialogues plus fp32's for the share it checks) becomes the
model's int8 recipe, its band the card's ``export.int8_verify``. The test splits then confirm it as served (the export's
comparison): int8 is the CPU default only when it passes on both and is the fastest that does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core import variants
from dialogue_safety.core.cpu import cpu_has_vnni
from dialogue_safety.core.encoding import DialogueEncoder
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import CALIBRATION_FILE
from dialogue_safety.core.runtime import portable_int8
from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.core.scoring import near_thresholds
from dialogue_safety.core.variants.calibration import save_calibration
from dialogue_safety.core.variants.stamps import file_sha256

log = logging.getLogger("dialogue_safety.export")

CALIBRATION_PER_SOURCE = 60  # dialogues per validation split (~1.4 rows each with a decomposed encoding)
CALIBRATION_SEED = 1


def calibration_split(
    validation_sets: Mapping[str, Sequence[LabelledExample]],
    per_source: int = CALIBRATION_PER_SOURCE,
    seed: int = CALIBRATION_SEED,
) -> tuple[dict[str, list[LabelledExample]], dict[str, list[LabelledExample]]]:
    """({split: calibration dialogues}, {split: the other dialogues, for choosing}), seeded, order kept."""
    calibration: dict[str, list[LabelledExample]] = {}
    held_out: dict[str, list[LabelledExample]] = {}
    for name, examples in sorted(validation_sets.items()):
        order = np.random.default_rng(seed).permutation(len(examples))
        chosen = set(order[:per_source].tolist())
        calibration[name] = [ex for i, ex in enumerate(examples) if i in chosen]
        rest = [ex for i, ex in enumerate(examples) if i not in chosen]
        if rest:
            held_out[name] = rest
    return calibration, held_out


def write_calibration(
    model_dir: str | Path, encoder: DialogueEncoder, calibration: Mapping[str, Sequence[LabelledExample]]
) -> dict[str, Any]:
    """Encode the calibration dialogues and write :data:`CALIBRATION_FILE`; returns the card's record of it."""
    rows, sources = [], []
    for name, examples in sorted(calibration.items()):
        for encoded in encoder.encode_batch(list(examples)):
            for row in (encoded, encoded.alone):
                if row is not None:
                    rows.append(row)
                    sources.append(name)
    path = save_calibration(Path(model_dir) / CALIBRATION_FILE, rows, sources)
    return {
        "file": CALIBRATION_FILE,
        "sha256": file_sha256(path),
        "bytes": path.stat().st_size,
        "rows": len(rows),
        "tokens": int(sum(len(r) for r in rows)),
        "dialogues": {name: len(examples) for name, examples in sorted(calibration.items())},
        "seed": CALIBRATION_SEED,
    }


def candidate_recipes(
    names: Sequence[str], calibration: Mapping[str, Any] | None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({name: full int8 recipe}, notes): static presets get the calibration file's sha256 (so a
    changed file is noticed at derivation) and are left out, with a note, without a calibration set."""
    recipes: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for name in names:
        if name not in variants.INT8_PRESETS:
            raise ValueError(f"unknown int8 preset {name!r}; known: {', '.join(sorted(variants.INT8_PRESETS))}")
        recipe = {"from": "optimized", **variants.INT8_PRESETS[name], "preset": name}
        if variants.needs_calibration(recipe):
            if calibration is None:
                notes.append(f"{name}: skipped (it needs a calibration set: pass validation data)")
                continue
            recipe["calibration_sha256"] = calibration["sha256"]
        recipes[name] = recipe
    return recipes, notes


#: the bands of the int8 check tried, narrowest first (0: int8 answers alone); a band of 0.1 sends a
#: sixth of 0.4.0's validation dialogues to fp32 with the "dynamic" recipe, past which int8 buys little
CHECK_BANDS: tuple[float, ...] = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1)
#: with a check, the validation agreement asked for: well above the gate's 99 % so that the test splits,
#: which judge the variant again, have room for their own near-threshold dialogues, and so that a flipped
#: verdict stays rare on inputs no split covers (0.995 let a benign identity sentence through, 0.356 -> 0.476)
CHECK_MIN_AGREEMENT = 0.998


def checked_scores(int8: np.ndarray, fp32: np.ndarray, thresholds: Sequence[float], band: float) -> np.ndarray:
    """What the runtime answers with the int8 check (:attr:`dialogue_safety.core.model_card.ModelCard.int8_check_band`):
    fp32's score where int8's lies within ``band`` of a threshold, else int8's."""
    return np.where(near_thresholds(int8, thresholds, band), fp32, int8)


def check_band_for(
    gold: Mapping[str, np.ndarray],
    fp32: Mapping[str, np.ndarray],
    int8: Mapping[str, np.ndarray],
    threshold: float,
    bands: Sequence[float] = CHECK_BANDS,
) -> dict[str, Any]:
    """The narrowest band of the int8 check with which int8 passes the gate on these splits: a band
    of 0 by the gate alone, a wider one only with at least :data:`CHECK_MIN_AGREEMENT` on every split.
    Returns ``{"band" (None: none of ``bands``), "checked_fraction", "gate", "splits", "tried": {band:
    {min_agreement, checked_fraction}}}``."""
    from dialogue_safety.export.comparison import compare_split, gate

    tried: dict[str, Any] = {}
    for band in bands:
        served = {s: checked_scores(int8[s], fp32[s], [threshold], band) for s in int8}
        checked = float(np.mean(np.concatenate([near_thresholds(int8[s], [threshold], band) for s in int8])))
        per_split = {s: compare_split(gold[s], fp32[s], served[s], threshold) for s in int8}
        verdict = gate(per_split)
        tried[f"{band:g}"] = {"min_agreement": verdict["min_agreement"], "checked_fraction": round(checked, 4)}
        enough = band == 0 or verdict["min_agreement"] >= CHECK_MIN_AGREEMENT
        if verdict["passed"] and enough:
            fraction = round(checked, 4)
            return {"band": band, "checked_fraction": fraction, "gate": verdict, "splits": per_split, "tried": tried}
    return {"band": None, "tried": tried}


#: dialogues per split scored alone and in shuffled batches to see whether int8's scores depend on the batch
BATCH_SAMPLE_PER_SPLIT = 40
BATCH_SIZE_MIXED = 32
#: the most a score may move with its batch neighbours (fp32 moves ~1e-6): per-tensor *dynamic* activation
#: scales are taken over the whole batch, so one dialogue's score follows the traffic it is batched with; static
#: scales do not, and blockwise ones may a little (so it is checked at every export)
BATCH_TOLERANCE = 1e-3


def batch_dependence(
    model_dir: str | Path, held_out: Mapping[str, Sequence[LabelledExample]], seed: int = CALIBRATION_SEED
) -> dict[str, Any]:
    """How much the int8 variant's scores (without the check) move with the batch: a sample of
    dialogues scored one at a time and in shuffled batches of :data:`BATCH_SIZE_MIXED`."""
    from dialogue_safety.core.runtime import CPU, OnnxClassifier

    sample = [ex for examples in held_out.values() for ex in list(examples)[:BATCH_SAMPLE_PER_SPLIT]]
    clf = OnnxClassifier(model_dir, variant="int8", providers=[CPU], int8_check=False)
    encoded = clf.encode(sample)
    alone = np.concatenate([clf.scores_encoded([row]) for row in encoded]) if encoded else np.zeros(0)
    mixed = np.empty(len(encoded))
    order = np.random.default_rng(seed).permutation(len(encoded))
    for start in range(0, len(encoded), BATCH_SIZE_MIXED):
        idx = order[start : start + BATCH_SIZE_MIXED]
        mixed[idx] = clf.scores_encoded([encoded[i] for i in idx.tolist()])
    t = clf.card.threshold
    diff = np.abs(mixed - alone)
    return {
        "dialogues": len(encoded),
        "max_abs_score_diff": float(diff.max(initial=0.0)),
        "changed_decisions": int(np.sum((mixed >= t) != (alone >= t))),
        "steady": bool(diff.max(initial=0.0) <= BATCH_TOLERANCE),
    }


#: timed passes over the held-out validation dialogues per candidate (and for fp32): the fastest counts
TIMING_PASSES = 2
#: a candidate earlier in the order is kept unless a later one is at least this much cheaper to serve:
#: one export's timings move by a few per cent on a shared machine
COST_MARGIN = 0.05


#: a portable candidate (7-bit weights: the same on every CPU, :func:`dialogue_safety.core.runtime.portable_int8`) is
#: kept unless an 8-bit one is at least this much cheaper to serve: an 8-bit recipe serves only on CPUs with VNNI (x86)
#: or ARM, and elsewhere the runtime serves fp32 instead, about twice as slow (0.4.0 on validation, VNNI: 7-bit
#: static-split-lean needs a 0.04 band, 3.5 % checked, ~3 % dearer than 8-bit's 0.02; without VNNI: int8 or fp32)
PORTABLE_MARGIN = 0.10


def choose_candidate(cost: Mapping[str, float], portable: Mapping[str, bool]) -> str:
    """Of the passing candidates (``cost``: served seconds, in the order of preference), the first within
    :data:`COST_MARGIN` of the cheapest; then a portable one instead of an 8-bit one unless the 8-bit one is at least
    :data:`PORTABLE_MARGIN` cheaper than the cheapest portable one (the portable one taken: the first within
    :data:`COST_MARGIN` of the cheapest portable)."""
    cheapest = min(cost.values())
    chosen = next(n for n in cost if cost[n] <= cheapest * (1 + COST_MARGIN))
    if portable.get(chosen):
        return chosen
    kept = {n: c for n, c in cost.items() if portable.get(n)}
    if not kept:
        return chosen
    cheapest_portable = min(kept.values())
    best = next(n for n in kept if kept[n] <= cheapest_portable * (1 + COST_MARGIN))
    return best if cost[chosen] > cheapest_portable * (1 - PORTABLE_MARGIN) else chosen


def served_seconds(int8_seconds: float, checked_fraction: float, fp32_seconds: float) -> float:
    """What serving a candidate costs on the validation dialogues: int8 scores every dialogue, and the
    fp32 check scores the ``checked_fraction`` near a threshold again."""
    return int8_seconds + checked_fraction * fp32_seconds


def select_int8_recipe(
    model_dir: str | Path,
    card: ModelCard,
    candidates: Mapping[str, Mapping[str, Any]],
    held_out: Mapping[str, Sequence[LabelledExample]] | None,
) -> dict[str, Any]:
    """Judge every candidate on the held-out validation dialogues; of those that pass the gate, alone or
    with the int8 check (:func:`check_band_for`), and whose scores do not depend on the batch they are
    computed in (:func:`batch_dependence`), the one cheapest to serve wins (:func:`served_seconds`:
    its own seconds on those dialogues plus the checked fraction of fp32's, the fastest of
    :data:`TIMING_PASSES`; the first in the order of ``candidates`` within :data:`COST_MARGIN` of the
    cheapest). A candidate that cannot be derived (an ``error`` in its record) does not pass.

    Updates ``card.export["recipes"]["int8"]`` and ``card.export["int8_verify"]`` (and saves the card);
    returns the record for ``card.export["int8_selection"]``: ``{"splits", "fp32_seconds", "candidates":
    {name: {gate, per-split numbers, check, batch_dependence, seconds, served_seconds}}, "chosen",
    "passed"}`` (``gate`` and the split numbers are int8 alone; ``check`` the narrowest passing band).
    Without held-out data the first candidate is taken unjudged. When none passes, the first candidate
    stays the int8 recipe, without a check, and ``passed`` is false.
    """
    from dialogue_safety.export.comparison import compare_split, gate, gold_labels, score_variants

    if not candidates:
        raise ValueError("select_int8_recipe needs at least one int8 recipe")
    names = list(candidates)
    record: dict[str, Any] = {"candidates": {}, "chosen": names[0], "passed": False}
    recipes = card.export.setdefault("recipes", {})
    card.export.pop("int8_verify", None)
    if not held_out:
        recipes["int8"] = dict(candidates[names[0]])
        card.save(model_dir)
        record["note"] = "no validation data: the first candidate was taken unjudged"
        return record
    record["splits"] = {name: len(examples) for name, examples in held_out.items()}
    # 8-bit candidates are judged as this CPU computes them: saturating u8*s8 pairs on x86 without VNNI
    record["export_cpu_vnni"] = cpu_has_vnni()
    gold = gold_labels(held_out)
    reference, threshold, fp32_seconds = score_variants(model_dir, held_out, ["fp32"], passes=TIMING_PASSES)
    record["fp32_seconds"] = fp32_seconds["fp32"]
    passing: list[str] = []
    for name in names:
        recipes["int8"] = dict(candidates[name])
        card.save(model_dir)  # ensure_variant reads the recipe from the card
        try:
            variants.ensure_variant(model_dir, "int8", card, force=True)
        except (variants.VariantError, RuntimeError) as exc:  # e.g. nbits8 without onnx-ir: the others still count
            record["candidates"][name] = {"error": str(exc)}
            log.warning("int8 candidate %s cannot be derived: %s", name, exc)
            continue
        scores, _, seconds = score_variants(model_dir, held_out, ["int8"], int8_check=False, passes=TIMING_PASSES)
        per_split = {s: compare_split(gold[s], reference["fp32"][s], scores["int8"][s], threshold) for s in held_out}
        check = check_band_for(gold, reference["fp32"], scores["int8"], threshold)
        batch = batch_dependence(model_dir, held_out)
        entry: dict[str, Any] = {
            "gate": gate(per_split),
            "splits": per_split,
            "check": check,
            "batch_dependence": batch,
            "seconds": seconds.get("int8"),
            "portable": portable_int8(candidates[name]),
        }
        if check["band"] is not None:
            served = served_seconds(seconds["int8"], check["checked_fraction"], record["fp32_seconds"])
            entry["served_seconds"] = round(served, 3)
        record["candidates"][name] = entry
        log.info(
            "int8 candidate %s on validation: %s; check band %s; scores move up to %.2g with the batch; served %s s",
            name,
            entry["gate"]["why"],
            check["band"],
            batch["max_abs_score_diff"],
            entry.get("served_seconds"),
        )
        if check["band"] is not None and batch["steady"]:
            if entry["portable"] or record["export_cpu_vnni"] is not False:
                passing.append(name)
            else:  # judged on saturating products, which no CPU that serves it computes
                entry["judged_without_vnni"] = True
    if not passing:
        recipes["int8"] = dict(candidates[names[0]])
        card.save(model_dir)
        if "error" not in record["candidates"].get(names[0], {}):
            variants.ensure_variant(model_dir, "int8", card, force=True)
        return record
    cost = {n: float(record["candidates"][n].get("served_seconds", float("inf"))) for n in passing}  # in order
    chosen = choose_candidate(cost, {n: record["candidates"][n]["portable"] for n in passing})
    band = record["candidates"][chosen]["check"]["band"]
    recipes["int8"] = dict(candidates[chosen])
    if band > 0:
        card.export["int8_verify"] = {
            "band": band,
            "against": "fp32",
            "validation_checked_fraction": record["candidates"][chosen]["check"]["checked_fraction"],
        }
    card.save(model_dir)
    variants.ensure_variant(model_dir, "int8", card, force=True)
    record.update(chosen=chosen, passed=True)
    return record
