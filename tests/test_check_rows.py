"""The check-per-row experiment runs end to end on a tiny decomposed model with a 7-bit int8 and an fp32 check:
with every dialogue in the band both rules give fp32's verdicts and re-read every token; with a narrow band the
per-row rule re-reads no more than the served one, and the served check agrees with fp32 at least as often as
the unchecked int8."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
import shutil
from pathlib import Path

from service_conftest import decomposed_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.variants import INT8_PRESETS
from lab.experiments.check_rows import main


def test_both_rules_measured_and_the_per_row_check_reads_fewer_fp32_tokens(
    decomposed_model_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(decomposed_model_dir, model)
    card = ModelCard.load(model)
    card.export.setdefault("recipes", {})["int8"] = {**INT8_PRESETS["dynamic"], "reduce_range": True}  # any CPU
    card.export["int8_verify"] = {"band": 0.05, "against": "fp32"}
    card.save(model)
    common = ["--model", str(model), "--limit", "40"]

    wide = main([*common, "--band", "1.0"])["valid"]
    assert wide["dialogues"] == wide["checked"] > 0 and wide["with_history"] > 0
    assert wide["agreement_with_fp32"]["served"] == wide["agreement_with_fp32"]["per_row"] == 1.0
    assert wide["fp32_tokens"]["served"] == wide["fp32_tokens"]["per_row"] == wide["int8_tokens"]

    out = tmp_path / "narrow.json"
    narrow = main([*common, "--band", "0.01", "--json", str(out)])["valid"]
    assert json.loads(out.read_text())["valid"] == narrow
    assert narrow["fp32_tokens"]["per_row"] <= narrow["fp32_tokens"]["served"] <= narrow["int8_tokens"]
    assert narrow["agreement_with_fp32"]["served"] >= narrow["agreement_with_fp32"]["int8"]
