"""Choosing the int8 variant at export: the calibration set it is derived from, and the recipe, by the gate.

    calibration = calibration_split(validation_sets)                 # {source: (calibration, held_out)}
    write_calibration(model_dir, encoder, calibration)               # model_dir/calibration.npz
    selection = select_int8_recipe(model_dir, card, candidates, held_out)

The calibration rows are a few hundred validation dialogues, :data:`CALIBRATION_PER_SOURCE` from each
source (seeded), encoded as the runtime encodes them (both rows of a ``"decomposed"`` encoding) and
stored in the model directory, so that the service derives the static int8 variant at start without
the datasets. The int8 recipes are tried in the given order (fastest first): each is derived and
judged against fp32 by :func:`dialogue_safety.export.comparison.gate` on the *held-out* validation
dialogues (never the calibration ones); the first that passes becomes the model's int8 recipe.
The test splits then confirm it (the export's comparison): int8 is the CPU default only when it
passes on both.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core import variants
from dialogue_safety.core.encoding import DialogueEncoder
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import CALIBRATION_FILE
from dialogue_safety.core.schema import LabelledExample
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
        if recipe["kind"] == "quantize_static":
            if calibration is None:
                notes.append(f"{name}: skipped (static int8 needs a calibration set: pass validation data)")
                continue
            recipe["calibration_sha256"] = calibration["sha256"]
        recipes[name] = recipe
    return recipes, notes


def select_int8_recipe(
    model_dir: str | Path,
    card: ModelCard,
    candidates: Mapping[str, Mapping[str, Any]],
    held_out: Mapping[str, Sequence[LabelledExample]] | None,
) -> dict[str, Any]:
    """Try the candidates in order on the held-out validation dialogues; the first that passes the gate wins.

    Updates ``card.export["recipes"]["int8"]`` (and saves the card) as it goes; returns the record for
    ``card.export["int8_selection"]``: ``{"splits", "candidates": {name: {gate, per-split numbers,
    seconds}}, "chosen", "passed"}``. Without held-out data the first candidate is taken unjudged.
    When none passes, the first candidate stays the int8 recipe and ``passed`` is false.
    """
    from dialogue_safety.export.comparison import compare_variants

    if not candidates:
        raise ValueError("select_int8_recipe needs at least one int8 recipe")
    names = list(candidates)
    record: dict[str, Any] = {"candidates": {}, "chosen": names[0], "passed": False}
    recipes = card.export.setdefault("recipes", {})
    if not held_out:
        recipes["int8"] = dict(candidates[names[0]])
        card.save(model_dir)
        record["note"] = "no validation data: the first candidate was taken unjudged"
        return record
    record["splits"] = {name: len(examples) for name, examples in held_out.items()}
    for name in names:
        recipes["int8"] = dict(candidates[name])
        card.save(model_dir)  # ensure_variant reads the recipe from the card
        variants.ensure_variant(model_dir, "int8", card, force=True)
        report = compare_variants(model_dir, held_out, variant_names=["int8"])
        verdict = report["gate"]["int8"]
        record["candidates"][name] = {
            "gate": verdict,
            "splits": report["variants"]["int8"],
            "seconds": report["seconds"].get("int8"),
        }
        log.info("int8 candidate %s on validation: %s", name, verdict["why"])
        if verdict["passed"]:
            record.update(chosen=name, passed=True)
            return record
    recipes["int8"] = dict(candidates[names[0]])
    card.save(model_dir)
    variants.ensure_variant(model_dir, "int8", card, force=True)
    return record
