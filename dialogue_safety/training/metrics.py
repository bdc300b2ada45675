"""Classification metrics for OFFENSIVE-vs-SAFE, built on scikit-learn.

The headline metric (BBF) is the F1 of the OFFENSIVE class. Every function takes gold labels
as booleans/0-1 (True = OFFENSIVE) and scores as probabilities of OFFENSIVE.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.metrics import (
    accuracy_score,
    average_precision_score,
    f1_score,
    precision_recall_fscore_support,
    roc_auc_score,
)

from dialogue_safety.core.scoring import is_offensive


def binary_metrics(
    gold: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray, threshold: float
) -> dict[str, Any]:
    """OFFENSIVE-class F1/precision/recall, weighted F1, accuracy, PR-AUC, ROC-AUC at ``threshold``.

    F1, precision and recall are in percent (as in the papers); AUCs in [0, 1]; an AUC is None
    when the gold labels hold a single class.
    """
    y = np.asarray(gold, dtype=int)
    s = np.asarray(scores, dtype=float)
    if y.shape != s.shape:
        raise ValueError(f"gold and scores differ in shape: {y.shape} vs {s.shape}")
    pred = is_offensive(s, threshold).astype(int)
    p, r, f, _ = precision_recall_fscore_support(y, pred, labels=[1], average=None, zero_division=0)
    both = len(np.unique(y)) == 2
    return {
        "n": int(y.size),
        "positives": int(y.sum()),
        "offensive_f1": 100.0 * float(f[0]),
        "precision": 100.0 * float(p[0]),
        "recall": 100.0 * float(r[0]),
        "weighted_f1": 100.0 * float(f1_score(y, pred, average="weighted", zero_division=0)) if y.size else 0.0,
        "accuracy": 100.0 * float(accuracy_score(y, pred)) if y.size else 0.0,
        "pr_auc": float(average_precision_score(y, s)) if both else None,
        "roc_auc": float(roc_auc_score(y, s)) if both else None,
        "threshold": float(threshold),
    }


def best_f1_threshold(gold: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """The threshold maximising OFFENSIVE-F1 (BBF's "final bias adjustment") and that F1 (percent).

    Candidates are the midpoints between consecutive distinct scores, so the chosen threshold
    does not sit exactly on a validation score.
    """
    y = np.asarray(gold, dtype=int)
    s = np.asarray(scores, dtype=float)
    if y.sum() == 0:
        return 0.5, 0.0
    order = np.argsort(-s, kind="stable")
    s_sorted, y_sorted = s[order], y[order]
    tp = np.cumsum(y_sorted)
    k = np.arange(1, y.size + 1)
    f1 = 2 * tp / (k + y.sum())
    # only cut between distinct scores
    distinct = np.r_[s_sorted[1:] != s_sorted[:-1], True]
    f1 = np.where(distinct, f1, -1.0)
    best = int(np.argmax(f1))
    nxt = s_sorted[best + 1] if best + 1 < s_sorted.size else s_sorted[best] - 1e-6
    threshold = float((s_sorted[best] + nxt) / 2)
    return threshold, 100.0 * float(f1[best])


def expected_calibration_error(
    gold: Sequence[int] | np.ndarray, probs: Sequence[float] | np.ndarray, bins: int = 15
) -> float:
    """ECE with equal-width bins over the probability of OFFENSIVE (Guo et al. 2017)."""
    y = np.asarray(gold, dtype=float)
    p = np.asarray(probs, dtype=float)
    if y.size == 0:
        return 0.0
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(p, edges[1:-1], right=True), 0, bins - 1)
    ece = 0.0
    for b in range(bins):
        mask = idx == b
        if mask.any():
            ece += mask.mean() * abs(p[mask].mean() - y[mask].mean())
    return float(ece)


def reliability_bins(
    gold: Sequence[int] | np.ndarray, probs: Sequence[float] | np.ndarray, bins: int = 10
) -> list[dict[str, float]]:
    """Per-bin mean confidence, observed positive rate and count (for reliability diagrams)."""
    y = np.asarray(gold, dtype=float)
    p = np.asarray(probs, dtype=float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(p, edges[1:-1], right=True), 0, bins - 1)
    out = []
    for b in range(bins):
        mask = idx == b
        out.append(
            {
                "lo": float(edges[b]),
                "hi": float(edges[b + 1]),
                "count": int(mask.sum()),
                "mean_prob": float(p[mask].mean()) if mask.any() else float("nan"),
                "positive_rate": float(y[mask].mean()) if mask.any() else float("nan"),
            }
        )
    return out
