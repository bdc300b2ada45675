"""``python -m lab.bench door`` runs end to end on the tiny model, and shows the one door: every endpoint reaches
the model through ``ServiceState.score``, and the admission rule is called from one method."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from lab.bench.cli import main as bench_main

STATE = "dialogue_safety/service/state.py"
BATCHER = "dialogue_safety/service/batcher.py"
ADMISSION = "dialogue_safety/service/admission.py"


def test_every_endpoint_crosses_the_one_door(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "door.json"
    endpoints = ["classify", "batch", "conversation", "moderations", "explain"]
    argv = ["door", "--model-dir", str(tiny_model_dir), "--variant", "fp32", "--endpoints", *endpoints]
    assert bench_main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())["endpoints"]
    assert set(report) == set(endpoints)
    for name, row in report.items():
        crossed = row["crossed"]
        assert "score" in crossed[STATE], name  # the one door
        assert "admission" in crossed[BATCHER], name  # the one place the admission rule is called from
        assert {"admit", "refusal"} <= set(crossed[ADMISSION]), name
        assert row["files"] == len(crossed)
    # a classification does not cross the moderation endpoint's module (no middleware of its own any more)
    assert "dialogue_safety/service/moderations.py" not in report["classify"]["crossed"]
    assert report["classify"]["service_files"] <= 12
    assert "| **files** |" in capsys.readouterr().out
