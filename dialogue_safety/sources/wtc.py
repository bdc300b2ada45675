"""Wikipedia Toxic Comments (Kaggle "Jigsaw Toxic Comment Classification Challenge").

Files (official Kaggle layout, plain or ``.gz``):

* ``train.csv`` — id, comment_text, toxic, severe_toxic, obscene, threat, insult, identity_hate.
  A comment is OFFENSIVE when any of the six columns is 1 (ParlAI's ``wikiToxicComments``
  teacher does the same). Like BBF/ParlAI we carve train/valid/test 80/10/10 out of train.csv,
  but deterministically: by :func:`~dialogue_safety.sources.splitting.three_way_split` of the comment
  id (salt ``"wtc"``), so the split never changes with row order or Python version.
* ``test.csv`` (id, comment_text) joined by id with ``test_labels.csv`` (id + the six columns),
  or a single file with both (the Detoxify sample ``test_with_labels_sample.csv``, which adds a
  leading unnamed index column). Rows labelled -1 were not scored by Kaggle and are skipped.
  These become task ``wtc/kaggle_test``, split TEST.

The shared data directory only has the Detoxify sample (``train_sample.csv`` 282 rows,
``test_with_labels_sample.csv`` 51 rows of which 26 scored): that is reported as sample-only.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, Status, existing_dirs, find_file
from dialogue_safety.sources.splitting import three_way_split

SOURCE = "wtc"
TEST_TASK = "wtc/kaggle_test"
LABEL_COLUMNS = ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")
DIRS = (
    "jigsaw-toxic-comment-classification-challenge",
    "jigsaw-toxic-comments",
    "jigsaw-toxic-comments-sample",
    "wikipedia-toxic-comments",
    "wtc",
)
SPLIT_SALT = "wtc"
_SAMPLE_NOTE = "Detoxify's test-data sample: real rows, far too few to train on"


def split_of(comment_id: str) -> Split:
    """The deterministic 80/10/10 split of a train.csv comment."""
    return three_way_split(comment_id, SPLIT_SALT, valid=0.1, test=0.1)


def _flags(row: CsvRow, *, test: bool = False) -> dict[str, int]:
    """The six labels of a row: 0 or 1, and also -1 (unscored) in the Kaggle test labels."""
    allowed, expected = ({"0", "1", "-1"}, "0, 1 or -1") if test else ({"0", "1"}, "0 or 1")
    flags: dict[str, int] = {}
    for column in LABEL_COLUMNS:
        value = row[column].strip()
        if value not in allowed:
            raise row.error(f"unknown label {value!r} in column {column} (expected {expected})")
        flags[column] = int(value)
    return flags


def _unscored(row: CsvRow, flags: dict[str, int]) -> bool:
    """True for a test row Kaggle did not score (every column -1)."""
    unscored = [v == -1 for v in flags.values()]
    if any(unscored) and not all(unscored):
        raise row.error("some label columns are -1 (unscored) and others are not")
    return all(unscored)


def _example(row: CsvRow, flags: dict[str, int], split: Split, task: str = "") -> LabelledExample:
    positive = tuple(c for c in LABEL_COLUMNS if flags[c])
    return LabelledExample(
        utterance=row.text("comment_text"),
        label=Label.from_bool(bool(positive)),
        source=SOURCE,
        split=split,
        family=LabelFamily.OFFENSIVE,
        task=task,
        metadata={"id": row["id"], "categories": positive},
    )


def read_train(path: Path) -> Iterator[LabelledExample]:
    """train.csv (or the sample), each row in its deterministic train/valid/test split."""
    for row in read_csv(path, ("id", "comment_text", *LABEL_COLUMNS)):
        yield _example(row, _flags(row), split_of(row.text("id")))


def _read_labels(path: Path) -> dict[str, CsvRow]:
    return {row.text("id"): row for row in read_csv(path, ("id", *LABEL_COLUMNS))}


def read_test(path: Path, labels_path: Path | None = None) -> Iterator[LabelledExample]:
    """The scored Kaggle test rows: test.csv joined with test_labels.csv, or one joined file."""
    labels = _read_labels(labels_path) if labels_path is not None else None
    required = ("id", "comment_text") if labels is not None else ("id", "comment_text", *LABEL_COLUMNS)
    for row in read_csv(path, required):
        label_row = row
        if labels is not None:
            found = labels.get(row.text("id"))
            if found is None:
                raise row.error(f"id {row['id']!r} has no row in {labels_path}")
            label_row = found
        flags = _flags(label_row, test=True)
        if not _unscored(label_row, flags):
            yield _example(row, flags, Split.TEST, TEST_TASK)


def find(data_dir: Path) -> SourceFiles:
    dirs = existing_dirs(data_dir, DIRS)
    train = find_file(dirs, ["train.csv"])
    if train is not None:
        files = {"train": train}
        test, labels = find_file([train.parent], ["test.csv"]), find_file([train.parent], ["test_labels.csv"])
        if test is not None and labels is not None:
            files |= {"test": test, "test_labels": labels}
            return SourceFiles(Status.COMPLETE, files)
        return SourceFiles(Status.PARTIAL, files, "train.csv only: test.csv + test_labels.csv not found")
    sample = {
        role: path
        for role, name in (("train", "train_sample.csv"), ("test", "test_with_labels_sample.csv"))
        if (path := find_file(dirs, [name])) is not None
    }
    return SourceFiles(Status.SAMPLE, sample, _SAMPLE_NOTE) if sample else SourceFiles.missing()


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    files = found.files
    if "train" in files:
        yield from (ex for ex in read_train(files["train"]) if ex.split in splits)
    if "test" in files and Split.TEST in splits:
        yield from read_test(files["test"], files.get("test_labels"))
