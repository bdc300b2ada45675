"""HatemojiBuild (Kirk et al., NAACL 2022): adversarial emoji-based hate, rounds R5-R7.

Files ``HatemojiBuild/{train,validation,test}.csv`` (the official 80/10/10 split; the file's
``split`` column must agree: train / dev / test). Columns: entry_id, text, type, target,
round.base, round.set, set, split, label_gold, matched_text, matched_id. ``label_gold`` 1 is
hateful (positive), 0 is not; ``round.base`` 5/6/7 becomes round ``"R5"``/``"R6"``/``"R7"``
(continuing DynaHate's R1-R4). ``target`` is a Python-list string (``"['mus', 'arab']"``),
parsed with :func:`ast.literal_eval`. Metadata: entry_id, matched_id, set
(original/perturbation), type, target (a tuple), round_set.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, read_split_files, split_status
from dialogue_safety.sources.splitting import parse_split

SOURCE = "hatemoji"
DIRS = ("hatemoji/HatemojiBuild", "HatemojiBuild", "Hatemoji/HatemojiBuild")
SPLIT_FILES = {"train": Split.TRAIN, "validation": Split.VALID, "test": Split.TEST}
REQUIRED = ("entry_id", "text", "type", "target", "round.base", "set", "split", "label_gold", "matched_id")
LABELS = {"1": Label.OFFENSIVE, "0": Label.SAFE}


def parse_target(row: CsvRow) -> tuple[str, ...]:
    """``"['mus', 'arab']"`` -> ``("mus", "arab")``."""
    raw = row["target"]
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise row.error(f"column target must be a Python list of strings, found {raw!r}")
    return tuple(value)


def example(row: CsvRow, split: Split) -> LabelledExample:
    label = LABELS.get(row["label_gold"].strip())
    if label is None:
        raise row.error(f"unknown label {row['label_gold']!r} in column label_gold (expected 0 or 1)")
    if parse_split(row["split"]) is not split:
        raise row.error(f"split {row['split']!r} in column split disagrees with the file ({split.value})")
    round_base = row["round.base"].strip()
    if not round_base.isdigit():
        raise row.error(f"round.base must be a number, found {round_base!r}")
    return LabelledExample(
        utterance=row.text("text"),
        label=label,
        source=SOURCE,
        split=split,
        family=LabelFamily.HATEFUL,
        round=f"R{round_base}",
        metadata={
            "entry_id": row["entry_id"],
            "matched_id": row["matched_id"],
            "set": row["set"],
            "type": row["type"],
            "target": parse_target(row),
            "round_set": row.get("round.set"),
        },
    )


def read_file(path: Path, split: Split) -> Iterator[LabelledExample]:
    for row in read_csv(path, REQUIRED):
        yield example(row, split)


def find(data_dir: Path) -> SourceFiles:
    roles = {name: [f"{name}.csv"] for name in SPLIT_FILES}
    found = find_files(existing_dirs(data_dir, DIRS), roles)
    status, note = split_status(found, SPLIT_FILES)
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return read_split_files(found, splits, SPLIT_FILES, read_file)
