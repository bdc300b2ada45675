"""Context sensitivity (BBF Table 10): the same dialogue examples scored with and without history.

For every dialogue source (one whose examples carry history) and split, each scorer is run
on the examples as they are and on ``Example.without_history()`` copies; the table reports
both sets of metrics and their difference (with − without). A model that ignores context
shows a difference near 0; BBF's multi-turn model gained 7.4 OFFENSIVE-F1 points from it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.evaluation.baseline import gold
from dialogue_safety.evaluation.rounds import scored_metrics, split_sort_key
from dialogue_safety.evaluation.scorers import Scorer, score

COMPARED: tuple[str, ...] = (
    "offensive_f1",
    "weighted_f1",
    "macro_f1",
    "accuracy",
    "precision",
    "recall",
    "roc_auc",
    "pr_auc",
)


def is_dialogue_source(examples: Sequence[LabelledExample]) -> bool:
    return any(e.history for e in examples)


def _difference(with_: Mapping[str, Any], without: Mapping[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in COMPARED:
        a, b = with_.get(key), without.get(key)
        out[key] = None if a is None or b is None else float(a) - float(b)
    return out


def evaluate_context(examples: Sequence[LabelledExample], scorers: Mapping[str, Scorer]) -> dict[str, Any]:
    """Rows per (source, split) of dialogue sources: metrics with/without history and the difference."""
    groups: dict[tuple[str, str], list[LabelledExample]] = defaultdict(list)
    for ex in examples:
        groups[(ex.source, ex.split.value)].append(ex)
    rows: list[dict[str, Any]] = []
    for (source, split), group in sorted(groups.items(), key=lambda kv: (kv[0][0], split_sort_key(kv[0][1]))):
        if not is_dialogue_source(group):
            continue
        y = gold(group)
        bare = [e.without_history() for e in group]
        row: dict[str, Any] = {
            "source": source,
            "split": split,
            "n": len(group),
            "n_with_history": sum(1 for e in group if e.history),
            "scorers": {},
        }
        for role, scorer in scorers.items():
            t = float(scorer.threshold)
            with_ = scored_metrics(y, score(scorer, group, desc=f"context {source}"), t)
            without = scored_metrics(y, score(scorer, bare, desc=f"no context {source}"), t)
            row["scorers"][role] = {"with": with_, "without": without, "difference": _difference(with_, without)}
        rows.append(row)
    return {"rows": rows}
