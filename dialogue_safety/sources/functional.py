"""Functional test suites in the HateCheck CSV layout (HateCheck, HatemojiCheck, ...).

One row per test case. A :class:`ColumnMapping` says which column holds the text, the gold
label (and which values are positive / negative), the functionality and, where the suite has
them, target, set, case id and direction. Presets:

* :data:`HATECHECK` — ``test_suite_cases.csv`` (Röttger et al., ACL 2021): test_case,
  label_gold hateful / non-hateful, functionality, target_ident, case_id, direction; no set.
* :data:`HATEMOJICHECK` — ``HatemojiCheck.csv`` (Kirk et al., NAACL 2022): text, label_gold
  1 / 0, functionality, target, set, case_id.

Every case is split TEST, family HATEFUL, source = the suite name; metadata: functionality,
target, set, case_id, direction (None where the suite has no such column or the cell is empty).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, Status, existing_dirs, find_file

HATECHECK_DIRS = ("hatecheck", "hatecheck-data")
HATECHECK_FILE = "test_suite_cases.csv"


@dataclass(frozen=True)
class ColumnMapping:
    """How a suite's CSV columns map onto a test case."""

    suite: str
    text: str
    label: str
    functionality: str
    positive: frozenset[str]
    negative: frozenset[str]
    target: str | None = None
    set: str | None = None
    case_id: str | None = None
    direction: str | None = None

    @property
    def required(self) -> tuple[str, ...]:
        optional = (self.target, self.set, self.case_id, self.direction)
        return (self.text, self.label, self.functionality, *(c for c in optional if c))


HATECHECK = ColumnMapping(
    suite="hatecheck",
    text="test_case",
    label="label_gold",
    functionality="functionality",
    positive=frozenset({"hateful"}),
    negative=frozenset({"non-hateful"}),
    target="target_ident",
    case_id="case_id",
    direction="direction",
)

HATEMOJICHECK = ColumnMapping(
    suite="hatemojicheck",
    text="text",
    label="label_gold",
    functionality="functionality",
    positive=frozenset({"1"}),
    negative=frozenset({"0"}),
    target="target",
    set="set",
    case_id="case_id",
)


def _optional(row: CsvRow, column: str | None) -> str | None:
    if column is None:
        return None
    value = row[column].strip()
    return value or None


def example(row: CsvRow, mapping: ColumnMapping) -> LabelledExample:
    value = row[mapping.label].strip()
    if value in mapping.positive:
        label = Label.OFFENSIVE
    elif value in mapping.negative:
        label = Label.SAFE
    else:
        expected = " or ".join(sorted(mapping.positive | mapping.negative))
        raise row.error(f"unknown label {value!r} in column {mapping.label} (expected {expected})")
    functionality = row[mapping.functionality].strip()
    if not functionality:
        raise row.error(f"empty functionality in column {mapping.functionality}")
    return LabelledExample(
        utterance=row.text(mapping.text),
        label=label,
        source=mapping.suite,
        split=Split.TEST,
        family=LabelFamily.HATEFUL,
        metadata={
            "functionality": functionality,
            "target": _optional(row, mapping.target),
            "set": _optional(row, mapping.set),
            "case_id": _optional(row, mapping.case_id),
            "direction": _optional(row, mapping.direction),
        },
    )


def read_suite(path: Path, mapping: ColumnMapping = HATECHECK) -> Iterator[LabelledExample]:
    """Every test case of a suite file."""
    for row in read_csv(path, mapping.required):
        yield example(row, mapping)


def find_hatecheck(data_dir: Path) -> SourceFiles:
    path = find_file(existing_dirs(data_dir, HATECHECK_DIRS), [HATECHECK_FILE])
    return SourceFiles(Status.COMPLETE, {"test": path}) if path else SourceFiles.missing()


def load_hatecheck(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    if "test" in found.files and Split.TEST in splits:
        yield from read_suite(found.files["test"], HATECHECK)
