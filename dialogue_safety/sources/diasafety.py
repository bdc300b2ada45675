"""DiaSafety (Sun et al., Findings of ACL 2022): is a reply unsafe given the user turn before it?

Files ``train``, ``val`` and ``test`` as ``.json`` or ``.json.gz`` (``DiaSafety_dataset/`` in
the upstream repository), each a JSON list of ``{"context": str, "response": str,
"category": str, "label": "Safe" | "Unsafe"}``. The context becomes a one-turn history
(speaker ``user``), the response is the utterance, ``Unsafe`` is positive. The family is
UNSAFE_IN_CONTEXT: the categories (toxicity agreement, unauthorised expertise, risk ignorance,
...) are wider than "offensive".

Three upstream rows (train 2, test 1; all "Risk Ignorance", labelled Safe) have an empty
response. They are kept, so the split sizes stay the official 9,017 / 1,097 / 1,095; an empty
context, category or label is a format error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_json
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, split_status

SOURCE = "diasafety"
DIRS = ("diasafety", "DiaSafety", "DiaSafety_dataset", "diasafety/DiaSafety_dataset")
SPLIT_FILES = {
    Split.TRAIN: ("train.json",),
    Split.VALID: ("val.json", "valid.json", "dev.json"),
    Split.TEST: ("test.json",),
}
LABELS = {"Safe": Label.SAFE, "Unsafe": Label.OFFENSIVE}


def _example(record: Any, split: Split, index: int, path: Path) -> LabelledExample:
    error = partial(DatasetFormatError, path, where=f"[{index}]")
    if not isinstance(record, dict):
        raise error(f"expected an object, found {type(record).__name__}")
    for key in ("context", "response", "category", "label"):
        if not isinstance(record.get(key), str):
            raise error(f"missing or non-string field {key!r}")
    if not record["context"].strip():
        raise error("empty text in field 'context'")
    label = LABELS.get(record["label"])
    if label is None:
        raise error(f"unknown label {record['label']!r} in field label (expected Safe or Unsafe)")
    return LabelledExample(
        utterance=record["response"],
        history=(Turn(record["context"], "user"),),
        label=label,
        source=SOURCE,
        split=split,
        family=LabelFamily.UNSAFE_IN_CONTEXT,
        metadata={"category": record["category"], "index": index},
    )


def read_file(path: Path, split: Split) -> Iterator[LabelledExample]:
    data = read_json(path)
    if not isinstance(data, list):
        raise DatasetFormatError(
            path, f"expected a JSON list of records, found {type(data).__name__}", where="the top level"
        )
    for index, record in enumerate(data):
        yield _example(record, split, index, path)


def find(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, DIRS), {split.value: names for split, names in SPLIT_FILES.items()})
    status, note = split_status(found, [s.value for s in SPLIT_FILES])
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    for name, path in found.files.items():
        if Split(name) in splits:
            yield from read_file(path, Split(name))
