"""The context-flip suite: the same reply after a harmful and after a harmless turn.

``dialogue_safety/evaluation/suites/context_flips.csv`` holds hand-written, hand-checked pairs (columns ``id``,
``category``, ``harmful_context``, ``harmless_context``, ``reply``): the reply is OFFENSIVE after
the harmful context (it encourages, agrees with or laughs along with harm) and SAFE after the
harmless one. Categories: self-harm, violence, harassment, hate, risky advice, sarcasm/quotes.
None of its texts is in the training data (the derived ``context_pairs`` source uses other phrase
lists; a test checks that no text is shared).

The headline is **pairs both right**: the share of pairs where the model says OFFENSIVE after the
harmful context *and* SAFE after the harmless one, at the scorer's own threshold. A model that
ignores the history can get at most one side of each pair right.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.schema import Example, Turn
from dialogue_safety.core.scoring import is_offensive
from dialogue_safety.evaluation.scorers import Scorer, score

SUITE_FILE = Path(__file__).with_name("suites") / "context_flips.csv"
COLUMNS = ("id", "category", "harmful_context", "harmless_context", "reply")


@dataclass(frozen=True)
class FlipPair:
    id: str
    category: str
    harmful_context: str
    harmless_context: str
    reply: str

    def examples(self) -> tuple[Example, Example]:
        """(after the harmful turn: OFFENSIVE, after the harmless turn: SAFE)."""
        return (
            Example(utterance=self.reply, history=(Turn(self.harmful_context, "user"),)),
            Example(utterance=self.reply, history=(Turn(self.harmless_context, "user"),)),
        )


def load_pairs(path: str | Path = SUITE_FILE) -> list[FlipPair]:
    """Read the suite; a missing column, an empty cell or a repeated id names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"context-flip suite {path} does not exist")
    pairs: list[FlipPair] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}:1: missing column(s) {', '.join(missing)} (expected {', '.join(COLUMNS)})")
        for row in reader:
            line = reader.line_num
            empty = [c for c in COLUMNS if not (row.get(c) or "").strip()]
            if empty:
                raise ValueError(f"{path}:{line}: empty {', '.join(empty)}")
            if row["id"] in seen:
                raise ValueError(f"{path}:{line}: id {row['id']!r} repeated")
            seen.add(row["id"])
            pairs.append(FlipPair(*(row[c].strip() for c in COLUMNS)))
    return pairs


def _summary(harmful_right: np.ndarray, harmless_right: np.ndarray) -> dict[str, Any]:
    n = int(harmful_right.size)
    both = harmful_right & harmless_right
    return {
        "pairs": n,
        "both_right": int(both.sum()),
        "both_right_pct": 100.0 * float(both.mean()) if n else None,
        "harmful_flagged_pct": 100.0 * float(harmful_right.mean()) if n else None,
        "harmless_passed_pct": 100.0 * float(harmless_right.mean()) if n else None,
    }


def evaluate_context_flips(pairs: Sequence[FlipPair], scorers: Mapping[str, Scorer]) -> dict[str, Any]:
    """Per scorer: pairs both right overall and per category, and each pair's two scores."""
    examples = [ex for p in pairs for ex in p.examples()]
    out: dict[str, Any] = {"pairs": len(pairs), "scorers": {}}
    for role, scorer in scorers.items():
        s = np.asarray(score(scorer, examples, desc="context flips"), dtype=float).reshape(len(pairs), 2)
        t = float(scorer.threshold)
        harmful_right, harmless_right = is_offensive(s[:, 0], t), ~is_offensive(s[:, 1], t)
        by_category: dict[str, list[int]] = defaultdict(list)
        for i, p in enumerate(pairs):
            by_category[p.category].append(i)
        out["scorers"][role] = {
            "threshold": t,
            "overall": _summary(harmful_right, harmless_right),
            "categories": {c: _summary(harmful_right[ix], harmless_right[ix]) for c, ix in sorted(by_category.items())},
            "failures": [
                {"id": p.id, "harmful_score": float(s[i, 0]), "harmless_score": float(s[i, 1])}
                for i, p in enumerate(pairs)
                if not (harmful_right[i] and harmless_right[i])
            ],
        }
    return out
