"""Held-out and adversarial rounds: metrics per task × round × split, for every scorer.

One row per (task, round, split), a combined row per round with sub-rounds (DynaHate
``4`` = ``4a`` + ``4b``) and an ``all`` row per (task, split) when the task has more than one
round. Each row holds, per scorer, ``dialogue_safety.training.metrics.binary_metrics`` (OFFENSIVE-F1,
weighted F1, precision, recall, accuracy, ROC-AUC, PR-AUC) plus macro-F1 (the DynaHate
papers' headline); accuracy on original vs perturbed entries where the metadata marks them
(DynaHate ``level``, HatemojiBuild ``set``); and the error rate of the round's
model-in-the-loop where the data records its predictions (n/a otherwise).

The report renders the rows twice: BBF Table 6 layout (tasks and rounds as rows) and
DynaHate Table 4 layout (rounds as columns).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.metrics import f1_score

from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.core.scoring import is_offensive
from dialogue_safety.evaluation.baseline import gold
from dialogue_safety.evaluation.scorers import Scorer, score
from dialogue_safety.training.metrics import binary_metrics, expected_calibration_error, reliability_bins

ALL_ROUNDS = "all"
NO_ROUND = "-"
#: metadata keys marking an entry as ``original`` or ``perturbation`` (DynaHate, HatemojiBuild)
PERTURBATION_KEYS: tuple[str, ...] = ("level", "set")
PERTURBATION_VALUES: tuple[str, ...] = ("original", "perturbation")
#: metadata keys that say whether the round's model-in-the-loop was fooled / what it predicted
MITL_WRONG_KEYS: tuple[str, ...] = ("model_wrong", "model_fooled", "fooled")
MITL_CORRECT_KEYS: tuple[str, ...] = ("model_correct",)
MITL_PREDICTION_KEYS: tuple[str, ...] = ("model_prediction", "model_pred", "model_label", "mitl_prediction")
_POSITIVE = {"1", "true", "yes", "hate", "hateful", "offensive", "unsafe", "abusive", "abuse", "__notok__"}
_NEGATIVE = {"0", "false", "no", "nothate", "not hateful", "non-hateful", "safe", "not_offensive", "__ok__", "none"}


def round_sort_key(name: str) -> tuple[int, int, str]:
    """Natural order: ``1 < 2a < 2b < 10 < R5 < R6 < all``; ``-`` (no round) first."""
    if name == NO_ROUND:
        return (-1, 0, "")
    if name == ALL_ROUNDS:
        return (2, 0, "")
    match = re.fullmatch(r"[A-Za-z]*?(\d+)(.*)", name)
    if match:
        return (0, int(match.group(1)), match.group(2))
    return (1, 0, name)


def base_round(name: str) -> str | None:
    """``"4a"`` → ``"4"``, ``"R2b"`` → ``"R2"``; None for a round without a letter suffix."""
    match = re.fullmatch(r"([A-Za-z]*\d+)[a-z]+", name)
    return match.group(1) if match else None


def split_sort_key(name: str) -> int:
    return {"train": 0, "valid": 1, "test": 2}.get(name, 3)


def macro_f1(y: np.ndarray, scores: np.ndarray, threshold: float) -> float:
    """Macro-averaged F1 over both classes, in percent (DynaHate reports this)."""
    if y.size == 0:
        return 0.0
    pred = is_offensive(scores, threshold).astype(int)
    return 100.0 * float(f1_score(y, pred, labels=[0, 1], average="macro", zero_division=0))


def scored_metrics(y: np.ndarray, scores: np.ndarray, threshold: float) -> dict[str, Any]:
    """``binary_metrics`` plus ``macro_f1``."""
    return {**binary_metrics(y, scores, threshold), "macro_f1": macro_f1(y, scores, threshold)}


def perturbation_level(example: LabelledExample) -> str | None:
    """``"original"`` / ``"perturbation"`` when the metadata marks it, else None."""
    for key in PERTURBATION_KEYS:
        value = example.metadata.get(key)
        if isinstance(value, str) and value.strip().lower() in PERTURBATION_VALUES:
            return value.strip().lower()
    return None


def _as_bool_label(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _POSITIVE:
            return True
        if v in _NEGATIVE:
            return False
    return None


def model_in_the_loop_wrong(example: LabelledExample) -> bool | None:
    """Whether the round's model-in-the-loop got this entry wrong, when the data says so."""
    meta = example.metadata
    for key in MITL_WRONG_KEYS:
        if key in meta and (value := _as_bool_label(meta[key])) is not None:
            return value
    for key in MITL_CORRECT_KEYS:
        if key in meta and (value := _as_bool_label(meta[key])) is not None:
            return not value
    for key in MITL_PREDICTION_KEYS:
        if key in meta and (value := _as_bool_label(meta[key])) is not None:
            return value != example.label.is_positive
    return None


def _accuracy(y: np.ndarray, scores: np.ndarray, threshold: float) -> float | None:
    return 100.0 * float(np.mean(is_offensive(scores, threshold).astype(int) == y)) if y.size else None


def _row(
    examples: Sequence[LabelledExample],
    idx: Sequence[int],
    probs: Mapping[str, np.ndarray],
    thresholds: Mapping[str, float],
    y_all: np.ndarray,
) -> dict[str, Any]:
    ix = np.asarray(idx, dtype=int)
    y = y_all[ix]
    row: dict[str, Any] = {"n": int(ix.size), "positives": int(y.sum())}
    row["metrics"] = {role: scored_metrics(y, probs[role][ix], thresholds[role]) for role in probs}
    levels = [perturbation_level(examples[i]) for i in ix]
    if any(level is not None for level in levels):
        pert: dict[str, Any] = {}
        for role in probs:
            pert[role] = {}
            for value in PERTURBATION_VALUES:
                sel = np.array([level == value for level in levels], dtype=bool)
                pert[role][value] = {
                    "n": int(sel.sum()),
                    "accuracy": _accuracy(y[sel], probs[role][ix][sel], thresholds[role]),
                }
        row["perturbation"] = pert
    else:
        row["perturbation"] = None
    wrong = [model_in_the_loop_wrong(examples[i]) for i in ix]
    known = [w for w in wrong if w is not None]
    row["model_in_the_loop"] = {
        "n": len(known),
        "error_rate": 100.0 * float(np.mean(known)) if known else None,
    }
    return row


def evaluate_rounds(examples: Sequence[LabelledExample], scorers: Mapping[str, Scorer]) -> dict[str, Any]:
    """Metrics per (task, round, split) for each scorer (keyed by role, e.g. model/baseline).

    Also returns, per scorer, the calibration (ECE and reliability bins) of the pooled test
    split (all rows' examples when nothing is marked test).
    """
    y_all = gold(examples)
    probs = {role: score(s, examples, desc="rounds") for role, s in scorers.items()}
    thresholds = {role: float(s.threshold) for role, s in scorers.items()}
    groups: dict[tuple[str, str, str, str], list[int]] = defaultdict(list)
    rounds_of: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for i, ex in enumerate(examples):
        rnd = ex.round if ex.round not in (None, "") else NO_ROUND
        split = ex.split.value
        groups[(ex.source, ex.task_name, rnd, split)].append(i)
        groups[(ex.source, ex.task_name, ALL_ROUNDS, split)].append(i)
        rounds_of[(ex.source, ex.task_name, split)].add(rnd)
    combined: dict[tuple[str, str, str, str], list[str]] = {}
    for (source, task, split), names in rounds_of.items():
        bases: dict[str, list[str]] = defaultdict(list)
        for name in names:
            if (base := base_round(name)) is not None:
                bases[base].append(name)
        for base, parts in bases.items():
            if len(parts) > 1 and base not in names:
                key = (source, task, base, split)
                combined[key] = sorted(parts, key=round_sort_key)
                groups[key] = sorted(i for part in parts for i in groups[(source, task, part, split)])
    rows: list[dict[str, Any]] = []
    for (source, task, rnd, split), idx in sorted(
        groups.items(),
        key=lambda kv: (kv[0][0], kv[0][1], split_sort_key(kv[0][3]), round_sort_key(kv[0][2])),
    ):
        if rnd == ALL_ROUNDS and len(rounds_of[(source, task, split)]) < 2:
            continue  # the single round's row already covers it
        head: dict[str, Any] = {"source": source, "task": task, "round": rnd, "split": split}
        if (source, task, rnd, split) in combined:
            head["combines"] = combined[(source, task, rnd, split)]
        rows.append(head | _row(examples, idx, probs, thresholds, y_all))
    test = np.array([ex.split.value == "test" for ex in examples], dtype=bool)
    if not test.any():
        test = np.ones(len(examples), dtype=bool)
    calibration = {
        role: {
            "n": int(test.sum()),
            "ece": expected_calibration_error(y_all[test], p[test]),
            "bins": reliability_bins(y_all[test], p[test]),
        }
        for role, p in probs.items()
    }
    return {"rows": rows, "calibration": calibration}
