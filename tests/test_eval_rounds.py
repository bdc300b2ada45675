"""Rounds suite on a hand-made toy source; every expected number is worked out in the comments."""

from __future__ import annotations

import pytest
from test_eval_support import KeywordScorer, ex

from dialogue_safety.evaluation.rounds import (
    base_round,
    evaluate_rounds,
    model_in_the_loop_wrong,
    perturbation_level,
    round_sort_key,
)

# keyword "bad" → predicted OFFENSIVE
EXAMPLES = [
    # round 1: pred 1,1,0,0 vs gold 1,0,0,1 → TP 1, FP 1, FN 1, TN 1; the MITL model was wrong on 3 of 4
    ex("bad a", True, round="1", model_wrong=True),
    ex("bad b", False, round="1", model_wrong=False),
    ex("good", False, round="1", model_wrong=True),
    ex("good c", True, round="1", model_wrong=True),
    # round 2a (originals): both right
    ex("bad x", True, round="2a", level="original"),
    ex("nice", False, round="2a", level="original"),
    # round 2b (perturbations): "bad y" is a false positive, "nice bad" a true positive
    ex("bad y", False, round="2b", level="perturbation"),
    ex("nice bad", True, round="2b", level="perturbation"),
]


def rows_by_round(result: dict) -> dict[str, dict]:
    return {r["round"]: r for r in result["rows"]}


def test_rounds_table_hand_computed() -> None:
    result = evaluate_rounds(EXAMPLES, {"model": KeywordScorer(["bad"])})
    rows = rows_by_round(result)
    assert [r["round"] for r in result["rows"]] == ["1", "2", "2a", "2b", "all"]

    r1 = rows["1"]["metrics"]["model"]
    assert (rows["1"]["n"], rows["1"]["positives"]) == (4, 2)
    assert r1["offensive_f1"] == pytest.approx(50.0)
    assert r1["precision"] == pytest.approx(50.0)
    assert r1["recall"] == pytest.approx(50.0)
    assert r1["accuracy"] == pytest.approx(50.0)
    assert r1["macro_f1"] == pytest.approx(50.0)  # SAFE class: P 1/2, R 1/2
    assert r1["weighted_f1"] == pytest.approx(50.0)
    assert r1["roc_auc"] == pytest.approx(0.5)  # scores 0.9, 0.9, 0.1, 0.1: one pos above one neg, ties elsewhere

    r2a = rows["2a"]["metrics"]["model"]
    assert r2a["offensive_f1"] == pytest.approx(100.0) and r2a["accuracy"] == pytest.approx(100.0)
    r2b = rows["2b"]["metrics"]["model"]
    assert r2b["offensive_f1"] == pytest.approx(200 / 3)  # P 1/2, R 1/1
    assert r2b["accuracy"] == pytest.approx(50.0)

    # "2" combines 2a + 2b: TP 2, FP 1, FN 0, TN 1 → P 2/3, R 1, F1 0.8
    assert rows["2"]["combines"] == ["2a", "2b"]
    assert rows["2"]["n"] == 4
    assert rows["2"]["metrics"]["model"]["offensive_f1"] == pytest.approx(80.0)
    # all 8: TP 3, FP 2, FN 1, TN 2 → P 60, R 75, F1 66.7, accuracy 62.5
    all_ = rows["all"]["metrics"]["model"]
    assert all_["precision"] == pytest.approx(60.0)
    assert all_["recall"] == pytest.approx(75.0)
    assert all_["offensive_f1"] == pytest.approx(2 * 0.6 * 0.75 / 1.35 * 100)
    assert all_["accuracy"] == pytest.approx(62.5)


def test_original_vs_perturbation_accuracy() -> None:
    rows = rows_by_round(evaluate_rounds(EXAMPLES, {"model": KeywordScorer(["bad"])}))
    assert rows["1"]["perturbation"] is None
    pert = rows["2"]["perturbation"]["model"]
    assert pert["original"] == {"n": 2, "accuracy": pytest.approx(100.0)}
    assert pert["perturbation"] == {"n": 2, "accuracy": pytest.approx(50.0)}


def test_model_in_the_loop_error_rate_or_na() -> None:
    rows = rows_by_round(evaluate_rounds(EXAMPLES, {"model": KeywordScorer(["bad"])}))
    assert rows["1"]["model_in_the_loop"] == {"n": 4, "error_rate": pytest.approx(75.0)}
    assert rows["2a"]["model_in_the_loop"] == {"n": 0, "error_rate": None}


def test_two_scorers_and_calibration() -> None:
    result = evaluate_rounds(EXAMPLES, {"model": KeywordScorer(["bad"]), "baseline": KeywordScorer(["nice"])})
    row = rows_by_round(result)["2a"]
    assert row["metrics"]["baseline"]["accuracy"] == pytest.approx(0.0)  # "nice" flagged, "bad x" missed
    cal = result["calibration"]["model"]
    assert cal["n"] == 8
    assert sum(b["count"] for b in cal["bins"]) == 8
    # ECE: bin 0.1 holds 3 examples with 1 positive, bin 0.9 holds 5 with 3 positive
    assert cal["ece"] == pytest.approx(3 / 8 * abs(0.1 - 1 / 3) + 5 / 8 * abs(0.9 - 3 / 5))


def test_helpers() -> None:
    assert sorted(["all", "2b", "10", "1", "2a", "-", "2"], key=round_sort_key) == [
        "-",
        "1",
        "2",
        "2a",
        "2b",
        "10",
        "all",
    ]
    assert sorted(["R7", "R5", "R6"], key=round_sort_key) == ["R5", "R6", "R7"]
    assert base_round("4a") == "4" and base_round("R2b") == "R2" and base_round("4") is None
    assert perturbation_level(ex("x", True, set="Original")) == "original"
    assert perturbation_level(ex("x", True, set="identity")) is None
    assert model_in_the_loop_wrong(ex("x", True, model_prediction="nothate")) is True
    assert model_in_the_loop_wrong(ex("x", False, model_correct=1)) is False
    assert model_in_the_loop_wrong(ex("x", False)) is None
