"""ConvAbuse (Cercas Curry, Abercrombie & Rieser, EMNLP 2021): abuse aimed at conversational agents.

Files ``ConvAbuseEMNLP{train,valid,test}.csv`` (plain or ``.gz``; ``2_splits/`` upstream), one
row per example. The user turn being judged is ``user``; its history is ``prev_agent``
(speaker ``agent``), ``prev_user`` (``user``) and ``agent`` (``agent``), oldest first, leaving
out empty and ``nan`` cells.

Label rule (the files have no aggregated label; this is ours)
-------------------------------------------------------------
Each annotator N has one-hot columns ``AnnotatorN_is_abuse.{1,0,-1,-2,-3}`` (1 = not abusive,
0 = ambiguous, -1/-2/-3 = mildly/strongly/very strongly abusive), blank where N did not label
the row. A row is OFFENSIVE iff **more than half of the annotators who labelled it chose -1, -2
or -3**; otherwise SAFE.

Repeat annotations: when an annotator labelled a row more than once, each of their cells holds
one 0/1 per annotation (``"1, 1"``, ``"0, 1"``). Such an annotator counts once, and counts as
choosing abuse iff more than half of *their* annotations chose -1/-2/-3 (a 1-1 tie does not).
(Comparing the cells with ``"1"`` literally would instead count an annotator who twice chose
-2 as not abusive: e.g. the test row "shut up" would become SAFE.)

With this rule the official splits have train 337 / 2,164, valid 112 / 719, test 127 / 726
OFFENSIVE / SAFE (the literal-``"1"`` reading gives 331 / 108 / 123 offensive).

Metadata: ``bot``, ``conv_id``, ``example_id``, ``annotators`` (how many labelled the row),
``abusive_votes``, and for OFFENSIVE rows the majority ``types`` (those of ableist,
homophobic, intellectual, racist, sexist, sex_harassment, transphobic chosen by more than half
of the annotators who chose abuse) and majority ``target`` (generalised / individual / system,
or None).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, read_split_files, split_status

SOURCE = "convabuse"
DIRS = ("convabuse", "convabuse/2_splits", "ConvAbuse")
SPLIT_FILES = {"train": Split.TRAIN, "valid": Split.VALID, "test": Split.TEST}
CONTEXT_COLUMNS = (("prev_agent", "agent"), ("prev_user", "user"), ("agent", "agent"))
REQUIRED = ("prev_agent", "prev_user", "agent", "user", "bot", "conv_id")
IS_ABUSE_VALUES = (1, 0, -1, -2, -3)
ABUSIVE_VALUES = frozenset({-1, -2, -3})
TYPES = ("ableist", "homophobic", "intellectual", "racist", "sexist", "sex_harassment", "transphobic")
TARGETS = ("generalised", "individual", "system")
_ANNOTATOR_COLUMN = re.compile(r"^(Annotator\d+)_(.+)$")


@dataclass(frozen=True)
class Annotator:
    """Where one annotator's columns are: field (``is_abuse.-1``, ``racist``, ...) -> column index."""

    name: str
    columns: dict[str, int]


def annotator_columns(header: Sequence[str], path: Path) -> list[Annotator]:
    """The annotators of a split file and their columns, checked to have all five is_abuse columns.

    A column name repeated within one annotator is given to the annotator whose block it sits in:
    upstream names Annotator7's ``transphobic`` column ``Annotator6_transphobic``.
    """
    columns: dict[str, dict[str, int]] = {}
    block: str | None = None
    for index, name in enumerate(header):
        match = _ANNOTATOR_COLUMN.match(name)
        if match is None:
            continue
        annotator, field = match.groups()
        if field.startswith("is_abuse."):
            block = annotator
        owner = block if field in columns.get(annotator, {}) and block is not None else annotator
        columns.setdefault(owner, {}).setdefault(field, index)
    if not columns:
        raise DatasetFormatError(path, "missing columns AnnotatorN_is_abuse.{1,0,-1,-2,-3}", line=1)
    for annotator, fields in columns.items():
        missing = [f"{annotator}_is_abuse.{v}" for v in IS_ABUSE_VALUES if f"is_abuse.{v}" not in fields]
        if missing:
            raise DatasetFormatError(path, f"missing column {', '.join(missing)}", line=1)
    return [Annotator(name, fields) for name, fields in columns.items()]


def _cell(row: CsvRow, index: int) -> list[int]:
    """The 0/1 of each annotation in a per-annotator cell: ``""`` -> [], ``"1, 0"`` -> [1, 0]."""
    raw = row.fields[index].strip()
    if not raw:
        return []
    values = []
    for part in raw.split(","):
        part = part.strip()
        if part not in {"0", "1", "0.0", "1.0"}:
            raise row.error(
                f"unknown value {raw!r} in column {row.header[index]} (expected 0, 1 or, for repeat "
                "annotations, a comma-separated list of them)"
            )
        values.append(int(float(part)))
    return values


def annotator_choices(row: CsvRow, annotator: Annotator) -> list[int]:
    """The is_abuse value the annotator chose in each of their annotations of the row ([] if none)."""
    cells = {v: _cell(row, annotator.columns[f"is_abuse.{v}"]) for v in IS_ABUSE_VALUES}
    count = max(len(values) for values in cells.values())
    if any(len(values) != count for values in cells.values()):
        raise row.error(f"{annotator.name}_is_abuse.* columns disagree on the number of annotations")
    choices = []
    for j in range(count):
        chosen = [v for v, values in cells.items() if values[j] == 1]
        if len(chosen) != 1:
            raise row.error(
                f"{annotator.name} annotation {j + 1}: expected one is_abuse column set to 1, found {len(chosen)}"
            )
        choices.append(chosen[0])
    return choices


def _majority(flags: Sequence[int]) -> bool:
    return 2 * sum(flags) > len(flags)


def _chose(row: CsvRow, annotator: Annotator, field: str) -> bool:
    index = annotator.columns.get(field)
    return index is not None and _majority(_cell(row, index) or [0])


def _majority_fields(row: CsvRow, abusive: list[Annotator], fields: Sequence[str], prefix: str = "") -> list[str]:
    return [f for f in fields if _majority([_chose(row, a, prefix + f) for a in abusive])]


def _history(row: CsvRow) -> tuple[Turn, ...]:
    cells = ((row[column], speaker) for column, speaker in CONTEXT_COLUMNS)
    return tuple(Turn(text, speaker) for text, speaker in cells if text.strip() and text.strip().lower() != "nan")


def _integer_text(value: str) -> str:
    """``"164070.0"`` (pandas wrote ids as floats) -> ``"164070"``."""
    return value[:-2] if value.endswith(".0") and value[:-2].isdigit() else value


def example(row: CsvRow, annotators: list[Annotator], split: Split) -> LabelledExample:
    labelled = [(a, c) for a in annotators if (c := annotator_choices(row, a))]
    if not labelled:
        raise row.error("no annotator labelled this row (all AnnotatorN_is_abuse.* cells are empty)")
    abusive = [a for a, choices in labelled if _majority([c in ABUSIVE_VALUES for c in choices])]
    offensive = 2 * len(abusive) > len(labelled)
    targets = _majority_fields(row, abusive, TARGETS, "target.") if offensive else []
    return LabelledExample(
        utterance=row.text("user"),
        history=_history(row),
        label=Label.from_bool(offensive),
        source=SOURCE,
        split=split,
        family=LabelFamily.OFFENSIVE,
        metadata={
            "bot": row["bot"],
            "conv_id": _integer_text(row["conv_id"]),
            "example_id": _integer_text(row.get("example_id")),
            "annotators": len(labelled),
            "abusive_votes": len(abusive),
            "types": tuple(_majority_fields(row, abusive, TYPES)) if offensive else (),
            "target": targets[0] if targets else None,
        },
    )


def read_file(path: Path, split: Split) -> Iterator[LabelledExample]:
    annotators: list[Annotator] | None = None
    for row in read_csv(path, REQUIRED):
        if annotators is None:
            annotators = annotator_columns(row.header, path)
        yield example(row, annotators, split)


def find(data_dir: Path) -> SourceFiles:
    roles = {name: [f"ConvAbuseEMNLP{name}.csv"] for name in SPLIT_FILES}
    found = find_files(existing_dirs(data_dir, DIRS), roles)
    status, note = split_status(found, SPLIT_FILES)
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return read_split_files(found, splits, SPLIT_FILES, read_file)
