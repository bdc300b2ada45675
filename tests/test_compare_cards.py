"""lab.experiments.compare_cards: two cards' metrics side by side, a drop of more than one point marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.experiments.compare_cards import main


def _card(path: Path, threshold: float, olid_f1: float) -> Path:
    path.mkdir()
    metric = {"all": {"offensive_f1": olid_f1, "recall": 70.0, "pr_auc": 0.8, "positives": 10}}
    safe_only = {"all": {"offensive_f1": 0.0, "recall": 0.0, "pr_auc": None, "positives": 0}}
    metrics = {split: {"olid": metric, "identity_mentions": safe_only} for split in ("test", "valid")}
    (path / "model_card.json").write_text(json.dumps({"threshold": threshold, "metrics": metrics}))
    return path


def test_a_drop_of_more_than_a_point_is_marked_and_safe_only_sets_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main([str(_card(tmp_path / "new", 0.36, 69.9)), str(_card(tmp_path / "old", 0.395, 72.4))])
    out = capsys.readouterr().out
    assert "thresholds: 0.36 / 0.395" in out
    assert out.count("| olid | 69.9 / 72.4 | -2.5 **below** |") == 2  # test and validation
    assert "identity_mentions" not in out
