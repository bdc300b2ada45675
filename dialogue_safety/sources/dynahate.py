"""DynaHate: the Dynamically Generated Hate Speech Dataset (Vidgen et al., ACL 2021), rounds 1-4.

Columns (v0.2.x): acl.id, X1, text, label (hate / nothate), type, target, level (original /
perturbation), split (train / dev / test), round.base, annotator, round (1, 2a, 2b, 3a, 3b, 4a,
4b), acl.id.matched (links an original and its perturbation, both ways). ``hate`` is positive.

Two layouts are read:

* **full** — ``Dynamically Generated Hate Dataset v0.2.3.csv`` (the highest ``v*.csv`` found in
  ``dynahate/`` or ``Dynamically-Generated-Hate-Speech-Dataset/``): official splits from the
  ``split`` column.
* **subset** — ``dynahate-subset/db_dev.csv(.gz)`` and ``db_test.csv(.gz)``: the dev and test
  rows with ``text_len`` <= 44 that the MaRCo repository committed; there is no train split.
  Test stays TEST. Dev is divided into TRAIN/VALID ~85/15, **grouped**: originals and
  perturbations linked through ``acl.id``/``acl.id.matched`` form one group (connected
  component, also through partners filtered out of the subset), named by its smallest id, and
  the whole group goes to VALID iff ``stable_fraction(group, "dynahate-subset") < 0.15``.
  Near-duplicate pairs therefore never straddle train and valid.

Source ``dynahate``, family HATEFUL, round as in the file; metadata: acl_id, matched_id,
level, type, target, round_base, variant (``full``/``subset``) and, for the subset, group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, Status, existing_dirs, find_file
from dialogue_safety.sources.splitting import parse_split, split_names, stable_fraction

SOURCE = "dynahate"
FULL_DIRS = ("dynahate", "Dynamically-Generated-Hate-Speech-Dataset")
SUBSET_DIRS = ("dynahate-subset",)
FULL_PATTERN = re.compile(r"^Dynamically Generated Hate Dataset v(\d+(?:\.\d+)*)\.csv(?:\.gz)?$")
REQUIRED = ("acl.id", "text", "label", "type", "target", "level", "split", "round", "acl.id.matched")
LABELS = {"hate": Label.OFFENSIVE, "nothate": Label.SAFE}
SUBSET_VALID_FRACTION = 0.15
SUBSET_SALT = "dynahate-subset"
_NO_MATCH = frozenset({"", "NA", "nan", "NaN"})
_SUBSET_NOTE = "dev + test rows with text_len <= 44 only; train/valid derived from dev (grouped)"


def group_ids(links: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Connected components of ``(id, matched id)`` links: each id -> the smallest id of its group.

    An empty matched id is no link. Ids seen only as a matched id still join the group, so the
    name of a group does not depend on which of its rows are present.
    """
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for node, matched in links:
        a = root(node)
        if matched:
            b = root(matched)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {node: root(node) for node in parent}


def matched_id(row: CsvRow) -> str:
    """The ``acl.id.matched`` cell, with R's ``NA`` and pandas' ``nan`` read as empty."""
    value = row["acl.id.matched"].strip()
    return "" if value in _NO_MATCH else value


def subset_split(group: str) -> Split:
    """TRAIN or VALID for a group of the subset's dev rows (~85/15)."""
    return Split.VALID if stable_fraction(group, SUBSET_SALT) < SUBSET_VALID_FRACTION else Split.TRAIN


def _file_split(row: CsvRow) -> Split:
    split = parse_split(row["split"])
    if split is None:
        raise row.error(f"unknown split {row['split']!r} in column split (expected one of {split_names()})")
    return split


def example(row: CsvRow, split: Split, variant: str, group: str | None = None) -> LabelledExample:
    label = LABELS.get(row["label"].strip())
    if label is None:
        raise row.error(f"unknown label {row['label']!r} in column label (expected hate or nothate)")
    round_ = row["round"].strip()
    if not round_:
        raise row.error("empty round in column round")
    metadata = {
        "acl_id": row.text("acl.id"),
        "matched_id": matched_id(row) or None,
        "level": row["level"],
        "type": row["type"],
        "target": row["target"],
        "round_base": row.get("round.base"),
        "variant": variant,
    }
    if group is not None:
        metadata["group"] = group
    return LabelledExample(
        utterance=row.text("text"),
        label=label,
        source=SOURCE,
        split=split,
        family=LabelFamily.HATEFUL,
        round=round_,
        metadata=metadata,
    )


def read_full(path: Path) -> Iterator[LabelledExample]:
    """The full v0.2.x file with its official splits."""
    for row in read_csv(path, REQUIRED):
        yield example(row, _file_split(row), "full")


def read_subset_dev(path: Path) -> list[LabelledExample]:
    """The subset's dev rows, divided into grouped TRAIN / VALID."""
    rows = list(read_csv(path, REQUIRED))
    for row in rows:
        if _file_split(row) is not Split.VALID:
            raise row.error(f"expected split dev in a dev file, found {row['split']!r}")
    groups = group_ids((row.text("acl.id"), matched_id(row)) for row in rows)
    return [example(row, subset_split(groups[row["acl.id"]]), "subset", groups[row["acl.id"]]) for row in rows]


def read_subset_test(path: Path) -> Iterator[LabelledExample]:
    for row in read_csv(path, REQUIRED):
        if _file_split(row) is not Split.TEST:
            raise row.error(f"expected split test in a test file, found {row['split']!r}")
        yield example(row, Split.TEST, "subset")


def _version(path: Path) -> tuple[int, ...]:
    match = FULL_PATTERN.match(path.name)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def find(data_dir: Path) -> SourceFiles:
    fulls = [p for folder in existing_dirs(data_dir, FULL_DIRS) for p in folder.iterdir() if _version(p)]
    if fulls:
        return SourceFiles(Status.COMPLETE, {"full": max(fulls, key=_version)})
    dirs = existing_dirs(data_dir, SUBSET_DIRS)
    found = {role: path for role in ("dev", "test") if (path := find_file(dirs, [f"db_{role}.csv"])) is not None}
    return SourceFiles(Status.PARTIAL, found, _SUBSET_NOTE) if found else SourceFiles.missing()


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    files = found.files
    if "full" in files:
        yield from (ex for ex in read_full(files["full"]) if ex.split in splits)
        return
    if "dev" in files and splits & {Split.TRAIN, Split.VALID}:
        yield from (ex for ex in read_subset_dev(files["dev"]) if ex.split in splits)
    if "test" in files and Split.TEST in splits:
        yield from read_subset_test(files["test"])
