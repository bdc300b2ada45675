"""Context sensitivity: the same dialogue examples with and without history, numbers by hand."""

from __future__ import annotations

import pytest
from test_eval_support import KeywordScorer, ex

from dialogue_safety.evaluation.context_ablation import evaluate_context

# keyword "bad", also seen in the history (score 0.6 ≥ 0.5 → OFFENSIVE)
DIALOGUE = [
    ex("yes", True, history=["you are bad"], source="chat"),  # with: TP; without: FN
    ex("hi", False, history=["hello"], source="chat"),  # TN both ways
    ex("sorry", False, history=["bad day"], source="chat"),  # with: FP; without: TN
    ex("bad", True, source="chat"),  # TP both ways (no history)
]
SINGLE_TURN = [ex("bad", True, source="tweets"), ex("fine", False, source="tweets")]


def test_with_and_without_history() -> None:
    result = evaluate_context(DIALOGUE + SINGLE_TURN, {"model": KeywordScorer(["bad"], use_history=True)})
    assert [r["source"] for r in result["rows"]] == ["chat"]  # sources without history get no row
    row = result["rows"][0]
    assert (row["n"], row["n_with_history"], row["split"]) == (4, 3, "test")
    m = row["scorers"]["model"]
    # with: TP 2, FP 1, FN 0, TN 1 → P 2/3, R 1, F1 80, accuracy 75
    assert m["with"]["offensive_f1"] == pytest.approx(80.0)
    assert m["with"]["accuracy"] == pytest.approx(75.0)
    # without: TP 1, FP 0, FN 1, TN 2 → P 1, R 1/2, F1 66.7, accuracy 75
    assert m["without"]["offensive_f1"] == pytest.approx(200 / 3)
    assert m["without"]["accuracy"] == pytest.approx(75.0)
    assert m["difference"]["offensive_f1"] == pytest.approx(80.0 - 200 / 3)
    assert m["difference"]["accuracy"] == pytest.approx(0.0)
    assert m["difference"]["precision"] == pytest.approx(200 / 3 - 100.0)


def test_context_blind_scorer_shows_no_difference() -> None:
    result = evaluate_context(DIALOGUE, {"model": KeywordScorer(["bad"])})
    diff = result["rows"][0]["scorers"]["model"]["difference"]
    assert diff["offensive_f1"] == pytest.approx(0.0) and diff["accuracy"] == pytest.approx(0.0)
