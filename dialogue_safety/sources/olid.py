"""OLID (Zampieri et al., SemEval-2019 OffensEval, sub-task A) as packaged by TweetEval.

Files ``{train,val,test}_text.txt`` and ``{train,val,test}_labels.txt`` (TweetEval's
``datasets/offensive/``): one tweet per line in the text file, its label on the same line of
the labels file (``1`` offensive, ``0`` not offensive; ``mapping.txt`` says so). User mentions
are ``@user`` and links ``URL`` upstream. Splits are TweetEval's as given (``val`` is VALID;
``test`` is the official OffensEval 2019 test set). No history: single tweets. The family is
OFFENSIVE: insults, threats and profanity at anyone count, not only hate against a group.

A labels file with a different number of lines than its text file, a label other than 0/1 or an
empty tweet is a format error naming the file and line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import open_text
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, split_status

SOURCE = "olid"
DIRS = ("olid", "OLID", "tweeteval/datasets/offensive", "offensive")
SPLITS = {"train": Split.TRAIN, "val": Split.VALID, "test": Split.TEST}
LABELS = {"1": Label.OFFENSIVE, "0": Label.SAFE}


def _lines(path: Path) -> list[str]:
    with open_text(path) as handle:
        return handle.read().splitlines()


def read_split(text_path: Path, labels_path: Path, split: Split) -> Iterator[LabelledExample]:
    texts, labels = _lines(text_path), _lines(labels_path)
    # a trailing blank line is not a record
    while labels and not labels[-1].strip():
        labels.pop()
    while texts and not texts[-1].strip() and len(texts) > len(labels):
        texts.pop()
    if len(texts) != len(labels):
        raise DatasetFormatError(
            labels_path,
            f"{len(labels)} labels for {len(texts)} tweets in {text_path.name} (one label per line expected)",
            line=min(len(texts), len(labels)) + 1,
        )
    for number, (text, raw) in enumerate(zip(texts, labels, strict=True), 1):
        label = LABELS.get(raw.strip())
        if label is None:
            raise DatasetFormatError(labels_path, f"unknown label {raw.strip()!r} (expected 0 or 1)", line=number)
        if not text.strip():
            raise DatasetFormatError(text_path, "empty tweet", line=number)
        yield LabelledExample(
            utterance=text.strip(),
            label=label,
            source=SOURCE,
            split=split,
            family=LabelFamily.OFFENSIVE,
            metadata={"line": number},
        )


def find(data_dir: Path) -> SourceFiles:
    roles = {f"{name}_{kind}": [f"{name}_{kind}.txt"] for name in SPLITS for kind in ("text", "labels")}
    found = find_files(existing_dirs(data_dir, DIRS), roles)
    status, note = split_status(found, roles)
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    for name, split in SPLITS.items():
        text, labels = found.files.get(f"{name}_text"), found.files.get(f"{name}_labels")
        if split in splits and text is not None and labels is not None:
            yield from read_split(text, labels, split)
