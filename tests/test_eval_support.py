"""Shared fakes for the evaluation tests: a keyword scorer, hand-made examples, a JSONL fixture loader.

Imported by the other ``test_eval_*`` modules (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.schema import Example, Label, LabelledExample, Split, Turn

FIXTURE_DATA = Path(__file__).parent / "fixtures" / "eval" / "data"
HIGH, MID, LOW = 0.9, 0.6, 0.1


class KeywordScorer:
    """P(OFFENSIVE) = 0.9 if a keyword is in the utterance, 0.6 if only in the history, else 0.1."""

    def __init__(self, keywords: Iterable[str], *, use_history: bool = False, threshold: float = 0.5) -> None:
        self.keywords = tuple(k.lower() for k in keywords)
        self.use_history = use_history
        self.threshold = threshold
        self.name = "keywords"
        self.calls: list[int] = []

    def _has(self, text: str) -> bool:
        return any(k in text.lower() for k in self.keywords)

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        self.calls.append(len(examples))
        out = []
        for e in examples:
            if self._has(e.utterance):
                out.append(HIGH)
            elif self.use_history and any(self._has(t.text) for t in e.history):
                out.append(MID)
            else:
                out.append(LOW)
        return np.array(out)


def ex(
    utterance: str,
    offensive: bool,
    *,
    history: Sequence[str] = (),
    source: str = "toy",
    split: Split = Split.TEST,
    round: str | None = None,
    task: str = "",
    **metadata: Any,
) -> LabelledExample:
    return LabelledExample(
        utterance=utterance,
        history=tuple(Turn(t) for t in history),
        label=Label.from_bool(offensive),
        source=source,
        split=split,
        task=task,
        round=round,
        metadata=metadata,
    )


def read_fixture_source(name: str, data_dir: Path) -> list[LabelledExample]:
    """``data_dir/sources/<name>.jsonl`` → examples (a missing file raises FileNotFoundError)."""
    path = data_dir / "sources" / f"{name}.jsonl"
    examples = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row: Mapping[str, Any] = json.loads(line)
        examples.append(
            LabelledExample(
                utterance=row["utterance"],
                history=tuple(Turn(t) for t in row.get("history", ())),
                label=Label(row["label"]),
                source=name,
                split=Split(row["split"]),
                round=row.get("round"),
                metadata=row.get("metadata", {}),
            )
        )
    return examples
