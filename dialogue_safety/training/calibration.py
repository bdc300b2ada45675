"""Calibration: temperature scaling per head and BBF's "final bias adjustment" (the threshold).

Temperatures are fitted on validation logits by minimising the binary NLL of
``sigmoid(logit / T)``; the decision threshold on the main score is then chosen on the
validation sets to maximise OFFENSIVE-F1, either pooled over all validation examples or as the
mean of the per-source F1s (``macro``, the default: every source counts the same, whatever its
size), or that mean less a penalty per point flagged of the sources without positives
(``selection``: keep-best's selection score, so the checkpoint and the threshold answer one objective).
The ``selection`` objective can also hold a general-moderation guard (``RecallFloors``): recall floors on
named validation sets of general (non-chat) text, each point of recall below its floor costing F1 points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize_scalar

from dialogue_safety.core.scoring import is_offensive
from dialogue_safety.training.metrics import best_f1_threshold


def _nll(logits: np.ndarray, gold: np.ndarray, temperature: float) -> float:
    z = logits / temperature
    # log(1 + exp(-|z|)) formulation of binary cross-entropy with logits
    return float(np.mean(np.maximum(z, 0) - z * gold + np.log1p(np.exp(-np.abs(z)))))


def fit_temperature(logits: np.ndarray, gold: np.ndarray) -> float:
    """The temperature minimising validation NLL (1.0 when there is nothing to fit)."""
    logits = np.asarray(logits, dtype=np.float64)
    gold = np.asarray(gold, dtype=np.float64)
    if logits.size == 0 or len(np.unique(gold)) < 2:
        return 1.0
    res = minimize_scalar(lambda lt: _nll(logits, gold, float(np.exp(lt))), bounds=(-3.0, 3.0), method="bounded")
    return float(np.exp(res.x))


def f1_at(gold: np.ndarray, scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """OFFENSIVE-F1 (percent) at each threshold, vectorised."""
    pred = is_offensive(scores[None, :], thresholds[:, None])
    tp = (pred & (gold[None, :] == 1)).sum(axis=1)
    denom = pred.sum(axis=1) + gold.sum()
    return np.where(denom > 0, 200.0 * tp / np.maximum(denom, 1), 0.0)


def recall_at(gold: np.ndarray, scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Recall (percent of the positives flagged) at each threshold, vectorised; 0 without positives."""
    positive = np.asarray(gold) == 1
    flagged = is_offensive(np.asarray(scores)[positive][None, :], np.asarray(thresholds)[:, None]).sum(axis=1)
    return 100.0 * flagged / max(int(positive.sum()), 1)


@dataclass(frozen=True)
class RecallFloors:
    """The general-moderation guard of the ``selection`` objective: the recall (%) each named validation set of
    general text must keep at the chosen threshold (``floors``), and the F1 points subtracted per point of recall
    below a floor, summed over the sets (``penalty``): a candidate that gains chatbot traffic by losing general
    moderation scores lower. A large penalty makes it a gate."""

    floors: Mapping[str, float]
    penalty: float

    def shortfall(self, recall: Mapping[str, Any]) -> Any:
        """Points of recall below the floors, summed (a float, or one per threshold for arrays of recall)."""
        missing = sorted(set(self.floors) - set(recall))
        if missing:
            raise ValueError(f"recall floors for {missing} but no validation set with positives to measure them on")
        return sum(
            np.maximum(0.0, floor - np.asarray(recall[name], dtype=float)) for name, floor in self.floors.items()
        )

    def cost(self, recall: Mapping[str, Any]) -> Any:
        """The F1 points the objective subtracts: ``penalty`` per point of ``shortfall``."""
        return self.penalty * self.shortfall(recall)

    def recall(self, per_source: Mapping[str, tuple[np.ndarray, np.ndarray]], threshold: float) -> dict[str, float]:
        """The recall (%) at ``threshold`` of each floored set found in ``per_source`` (served gold, score)."""
        at = np.array([threshold])
        return {n: float(recall_at(*per_source[n], at)[0]) for n in sorted(self.floors) if n in per_source}


def safe_only(per_source: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The sources with rows and no positives (written sets of SAFE sentences): no F1, a share flagged."""
    return {name: gs for name, gs in per_source.items() if len(gs[0]) and not np.asarray(gs[0]).any()}


def false_alarm_cost(flagged: Sequence[Any], false_alarm_penalty: float) -> Any:
    """The F1 points the ``selection`` objective subtracts: ``false_alarm_penalty`` per point (%) flagged of the
    SAFE-only sources (the mean of their shares ``flagged``, each a float or one per threshold); 0 without any."""
    return false_alarm_penalty * 100 * np.mean(np.asarray(flagged, dtype=float), axis=0) if len(flagged) else 0.0


def choose_threshold(
    per_source: Mapping[str, tuple[np.ndarray, np.ndarray]],
    objective: str = "macro",
    false_alarm_penalty: float = 0.0,
    floors: RecallFloors | None = None,
    guarded: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[float, dict[str, float]]:
    """Pick the threshold on validation (gold, score) pairs; return it and the per-source F1 there.

    A source without positives (a written set of SAFE sentences) has no F1: ``macro`` and ``selection``
    leave it out of the mean and of the returned F1s; ``pooled`` counts its examples as negatives;
    ``selection`` subtracts ``false_alarm_penalty`` F1 points per point (%) of such sources flagged (their mean),
    and with ``floors`` the guard's cost of the recall on the ``guarded`` sets (gold, score; they need not be
    among ``per_source``)."""
    if objective in ("macro", "selection"):
        safe = safe_only(per_source)
        per_source = {name: gs for name, gs in per_source.items() if np.asarray(gs[0]).any()}
    if not per_source:
        raise ValueError("no validation data to choose a threshold on")
    if objective == "pooled":
        gold = np.concatenate([g for g, _ in per_source.values()])
        scores = np.concatenate([s for _, s in per_source.values()])
        threshold, _ = best_f1_threshold(gold, scores)
    elif objective in ("macro", "selection"):
        grid = np.linspace(0.01, 0.99, 197)
        total = np.mean([f1_at(np.asarray(g), np.asarray(s), grid) for g, s in per_source.values()], axis=0)
        if objective == "selection":
            flagged = [is_offensive(np.asarray(s)[None, :], grid[:, None]).mean(axis=1) for _, s in safe.values()]
            total = total - false_alarm_cost(flagged, false_alarm_penalty)
            if floors is not None:
                sets = guarded or {}
                total = total - floors.cost(
                    {n: recall_at(np.asarray(g), np.asarray(s), grid) for n, (g, s) in sets.items()}
                )
        threshold = round(float(grid[int(np.argmax(total))]), 4)  # grid points: no 0.36000000000000004
    else:
        raise ValueError(f"unknown threshold objective {objective!r}")
    at = {
        name: float(f1_at(np.asarray(g), np.asarray(s), np.array([threshold]))[0])
        for name, (g, s) in per_source.items()
    }
    return threshold, at
