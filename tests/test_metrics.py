"""Metrics and calibration against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dialogue_safety.training.calibration import choose_threshold, f1_at, fit_temperature
from dialogue_safety.training.metrics import (
    best_f1_threshold,
    binary_metrics,
    expected_calibration_error,
    reliability_bins,
)


def test_binary_metrics_by_hand() -> None:
    # gold 1 1 1 0 0 0, scores → predictions at 0.5: 1 1 0 1 0 0
    m = binary_metrics([1, 1, 1, 0, 0, 0], [0.9, 0.8, 0.3, 0.7, 0.2, 0.1], 0.5)
    # TP 2, FP 1, FN 1: P = 2/3, R = 2/3, F1 = 2/3; SAFE class also F1 2/3 → weighted 2/3
    assert m["offensive_f1"] == pytest.approx(200 / 3)
    assert m["precision"] == pytest.approx(200 / 3)
    assert m["recall"] == pytest.approx(200 / 3)
    assert m["weighted_f1"] == pytest.approx(200 / 3)
    assert m["accuracy"] == pytest.approx(400 / 6)
    # ROC-AUC: of 9 (pos, neg) pairs, the pos scores 0.3 loses to 0.7 only → 8/9
    assert m["roc_auc"] == pytest.approx(8 / 9)
    # PR-AUC (average precision): positives at ranks 1, 2, 4 → (1 + 1 + 3/4) / 3
    assert m["pr_auc"] == pytest.approx((1 + 1 + 0.75) / 3)
    assert m["n"] == 6 and m["positives"] == 3


def test_single_class_has_no_auc_and_no_crash() -> None:
    m = binary_metrics([0, 0], [0.1, 0.9], 0.5)
    assert m["roc_auc"] is None and m["pr_auc"] is None
    assert m["offensive_f1"] == 0.0 and m["accuracy"] == 50.0


def test_best_threshold_cuts_between_scores() -> None:
    # cutting below 0.4 predicts {0.9, 0.6, 0.4} → TP 2 of 3 predicted, 2 positives: F1 = 0.8
    threshold, f1 = best_f1_threshold([1, 0, 1, 0], [0.9, 0.6, 0.4, 0.2])
    assert f1 == pytest.approx(80.0)
    assert threshold == pytest.approx(0.3)  # midway between 0.4 and 0.2


def test_expected_calibration_error_by_hand() -> None:
    # two bins used: [0.0-0.5): probs 0.2, 0.2 with outcomes 0, 1 → |0.2 - 0.5| = 0.3, weight 1/2
    #                [0.5-1.0]: probs 0.8, 0.8 with outcomes 1, 1 → |0.8 - 1.0| = 0.2, weight 1/2
    assert expected_calibration_error([0, 1, 1, 1], [0.2, 0.2, 0.8, 0.8], bins=2) == pytest.approx(0.25)
    bins = reliability_bins([0, 1, 1, 1], [0.2, 0.2, 0.8, 0.8], bins=2)
    assert [b["count"] for b in bins] == [2, 2]
    assert bins[0]["positive_rate"] == pytest.approx(0.5)


def test_temperature_recovers_a_known_scale() -> None:
    rng = np.random.default_rng(0)
    true_logits = rng.normal(0, 2, 20000)
    gold = (rng.random(true_logits.size) < 1 / (1 + np.exp(-true_logits))).astype(float)
    overconfident = 3.0 * true_logits
    assert fit_temperature(overconfident, gold) == pytest.approx(3.0, rel=0.05)
    assert fit_temperature(np.array([1.0, 2.0]), np.array([1.0, 1.0])) == 1.0  # one class: nothing to fit


def test_macro_threshold_treats_sources_equally() -> None:
    gold_a, s_a = np.array([1, 0]), np.array([0.9, 0.1])
    assert f1_at(gold_a, s_a, np.array([0.5, 0.95])).tolist() == [100.0, 0.0]
    big = (np.array([1] * 10 + [0] * 90), np.r_[np.full(10, 0.3), np.full(90, 0.2)])
    small = (np.array([1, 0]), np.array([0.8, 0.25]))
    t, at = choose_threshold({"big": big, "small": small}, "macro")
    assert 0.25 < t <= 0.3  # both sources perfect only in (0.25, 0.3]
    assert at == {"big": 100.0, "small": 100.0}
    with pytest.raises(ValueError, match="objective"):
        choose_threshold({"big": big}, "median")
