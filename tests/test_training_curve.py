"""The training curve: read from a run's metrics log (legs resumed across sessions), in the card and plotted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.evaluation.plots import write_plots
from dialogue_safety.evaluation.report import header_section
from dialogue_safety.export.card_markdown import render_model_card
from dialogue_safety.training.curve import curve_table, read_curve


def _log(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def _valid(step: int, macro: float, bot: float) -> dict[str, Any]:
    return {
        "event": "valid",
        "step": step,
        "epoch": step // 300,
        "macro_f1": macro,
        "threshold": 0.3,
        "offensive_f1": {"bad_fsb/bot": bot, "olid": 70.0},
    }


def test_a_run_resumed_across_legs_reads_as_one_curve(tmp_path: Path) -> None:
    log = _log(
        tmp_path / "metrics.jsonl",
        [
            {"event": "start", "total_steps": 600},
            *({"event": "train", "step": s, "loss": 1.0 / s, "elapsed_s": s * 2.0} for s in range(20, 260, 20)),
            _valid(200, 50.0, 40.0),
            # the session ended at step 240; the checkpoint was at 200: the next leg repeats 220 and 240
            {"event": "start", "total_steps": 600},
            *({"event": "train", "step": s, "loss": 0.5 / s, "elapsed_s": 60.0 + s} for s in range(220, 620, 20)),
            _valid(400, 60.0, 55.0),
            _valid(600, 62.5, 58.25),
        ],
    )
    curve = read_curve(log, loss_every=200)
    assert curve["legs"] == 2
    assert curve["train_seconds"] == 240 * 2.0 + 60.0 + 600  # each leg's last elapsed time, summed
    assert curve["loss"] == [[200, round(1.0 / 200, 4)], [400, round(0.5 / 400, 4)], [600, round(0.5 / 600, 4)]]
    assert [c["step"] for c in curve["valid"]] == [200, 400, 600]
    table = curve_table(curve)
    assert table[0] == "| step | epoch | loss | macro F1 | bad_fsb/bot | olid |"
    assert table[-1] == "| 600 | 2 | 0.001 | 62.5 | 58.2 | 70.0 |"


def test_a_broken_metrics_line_names_file_and_line(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"event": "start"}\n{"event": "train", "step"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2: not a JSON line"):
        read_curve(log)


def test_the_card_shows_the_curve_and_the_report_plots_it(tmp_path: Path) -> None:
    curve = {"valid": [_valid(100, 55.0, 41.0), _valid(200, 61.0, 52.5)], "loss": [[100, 0.41], [200, 0.33]]}
    card = ModelCard(
        name="m",
        version="1",
        heads=["offensive"],
        score_heads=["offensive"],
        threshold=0.4,
        training={
            "examples": {"olid": {"train": 10, "valid": 2, "test": 2}},
            "steps": 200,
            "legs": 2,
            "train_seconds": 600.0,
            "device": "cpu",
            "recipe": {"name": "r", "epochs": 3.0, "learning_rate": 5e-5},
            "curve": curve,
        },
    )
    md = render_model_card(card)
    assert "10.0 min on cpu in 2 resumed legs" in md
    assert "### Validation curve" in md and "| 200 | 0 | 0.330 | 61.0 | 52.5 | 70.0 |" in md
    results = {"model": {"name": "m", "threshold": 0.4, "training_curve": curve}, "config": {"suites": []}}
    plots = write_plots(results, tmp_path)
    assert plots["training_curve"] == "training_curve.png" and (tmp_path / "training_curve.png").stat().st_size > 0
    assert "![training curve](training_curve.png)" in "\n".join(header_section(results, plots))
    without = {"model": {"name": "m", "threshold": 0.4}, "config": {"suites": []}}
    assert "training_curve" not in write_plots(without, tmp_path / "none")
