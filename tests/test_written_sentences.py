"""The one loader of written training sentences (dialogue_safety/sources/written.py): TSV beside the code, one
row a sentence with its key, label and text; malformed files name the file, the line and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from dialogue_safety.core.schema import Label
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.written import WRITTEN_DIR, read_written, written_path


def test_rows_keep_key_label_text_other_columns_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.tsv"
    rows = [
        "word\tlabel\ttext\tkind",
        'nuke\tOFFENSIVE\tHow do I "nuke" him\trequest',
        "",
        "nuke\tSAFE\tNuke the leftovers\trequest",
    ]
    path.write_text("\n".join(rows) + "\n")
    first, second = read_written(path, "word", ["kind"])
    assert (first.key, first.label, first.text, first.line) == ("nuke", Label.OFFENSIVE, 'How do I "nuke" him', 2)
    assert first.fields["kind"] == "request"  # a quote mark is a character: no quoting
    assert (second.label, second.line) == (Label.SAFE, 4)  # the blank line is skipped, lines still counted


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("verb\ttext\nstab\tx\n", r"s\.tsv:1: missing column label"),
        ("verb\tlabel\ttext\nstab\tMAYBE\tx\n", r"s\.tsv:2: unknown label 'MAYBE'"),
        ("verb\tlabel\ttext\nstab\tSAFE\tx\ty\n", r"s\.tsv:2: expected 3 tab-separated fields, found 4"),
        ("verb\tlabel\ttext\nstab\tSAFE\t \n", r"s\.tsv:2: empty text"),
    ],
)
def test_a_malformed_file_names_the_file_line_and_problem(tmp_path: Path, body: str, problem: str) -> None:
    path = tmp_path / "s.tsv"
    path.write_text(body)
    with pytest.raises(DatasetFormatError, match=problem):
        read_written(path, "verb")


def test_every_written_file_reads() -> None:
    files = sorted(WRITTEN_DIR.glob("*.tsv"))
    assert written_path("threats") in files
    for path in files:
        key = path.read_text(encoding="utf-8").split("\t", 1)[0]
        assert read_written(path, key)
