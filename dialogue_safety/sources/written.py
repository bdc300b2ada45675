"""Sentences this project writes for training: data files beside the code, one row a sentence, one loader.

Written training sentences live in data files, never as Python literals (docs/data.md): a written
source keeps its sentences in ``dialogue_safety/sources/written/<name>.tsv`` and reads them with
:func:`read_written`. A file is UTF-8, tab-separated, with a header row; every row is one sentence:

* the **key** column (its name is the source's: ``verb``, ``word``, ``frame``) is what splits the rows:
  every row of a key goes to one split, by a stable hash of the key;
* ``label`` is ``OFFENSIVE`` or ``SAFE``;
* ``text`` is the sentence;
* any other column is the source's own (a kind, a target).

No quoting: a text holds no tab and no line break, so a row is one line and a quote mark is just a
character. A malformed file raises :class:`~dialogue_safety.sources.errors.DatasetFormatError` naming
the file, the line and the problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dialogue_safety.core.schema import Label
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import open_text

WRITTEN_DIR = Path(__file__).with_name("written")
SUFFIX = ".tsv"
LABEL, TEXT = "label", "text"


@dataclass(frozen=True)
class WrittenRow:
    """One written sentence: its key, label and text, the other columns, and the line it is on."""

    key: str
    label: Label
    text: str
    fields: Mapping[str, str]
    line: int


def written_path(name: str) -> Path:
    """Where the written source ``name`` keeps its sentences."""
    return WRITTEN_DIR / f"{name}{SUFFIX}"


def read_written(path: Path, key: str, columns: Sequence[str] = ()) -> list[WrittenRow]:
    """Every row of a written-sentence file, in file order; ``key`` names the splitting column and
    ``columns`` the source's other required columns."""
    with open_text(path) as handle:
        lines = handle.read().split("\n")
    header = lines[0].rstrip("\r").split("\t") if lines else []
    missing = [c for c in (key, LABEL, TEXT, *columns) if c not in header]
    if missing:
        raise DatasetFormatError(path, f"missing column {', '.join(missing)} (header: {', '.join(header)})", line=1)
    rows = []
    for number, raw in enumerate(lines[1:], 2):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != len(header):
            raise DatasetFormatError(
                path, f"expected {len(header)} tab-separated fields, found {len(cells)}", line=number
            )
        fields = dict(zip(header, cells, strict=True))
        if fields[LABEL] not in Label.__members__:
            raise DatasetFormatError(path, f"unknown label {fields[LABEL]!r} (expected OFFENSIVE or SAFE)", line=number)
        if not fields[key].strip() or not fields[TEXT].strip():
            raise DatasetFormatError(path, f"empty {key if not fields[key].strip() else TEXT}", line=number)
        rows.append(WrittenRow(fields[key], Label(fields[LABEL]), fields[TEXT], fields, number))
    return rows
