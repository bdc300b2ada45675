"""Reading dataset files: plain or gzip text, CSV rows that know their line, JSON documents.

Every reader reports problems as :class:`DatasetFormatError` naming the file and position.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from dialogue_safety.sources.errors import DatasetFormatError

# Comment texts in the Kaggle / DynaHate files exceed the csv module's 128 KiB default field cap.
csv.field_size_limit(16 * 1024 * 1024)


def open_text(path: Path) -> TextIO:
    """Open a UTF-8 text file for reading, transparently gunzipping ``*.gz`` (a BOM is dropped)."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


@dataclass(frozen=True, slots=True)
class CsvRow:
    """One CSV record: its fields, the physical line it starts on (header = line 1) and its header."""

    path: Path
    line: int
    fields: tuple[str, ...]
    header: tuple[str, ...]
    columns: dict[str, int]  # column name -> index of its first occurrence in the header

    def __getitem__(self, column: str) -> str:
        return self.fields[self.columns[column]]

    def get(self, column: str, default: str = "") -> str:
        index = self.columns.get(column)
        return default if index is None else self.fields[index]

    def text(self, column: str) -> str:
        """The cell, which must not be empty or whitespace only."""
        value = self[column]
        if not value.strip():
            raise self.error(f"empty text in column {column}")
        return value

    def error(self, problem: str) -> DatasetFormatError:
        return DatasetFormatError(self.path, problem, line=self.line)


def read_csv(path: Path, required: Iterable[str] = (), delimiter: str = ",") -> Iterator[CsvRow]:
    """Yield the records of a CSV file after checking that the header has the ``required`` columns.

    A record with a different number of fields than the header is a format error.
    """
    with open_text(path) as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = tuple(next(reader))
        except StopIteration:
            raise DatasetFormatError(path, "empty file: no header", line=1) from None
        except csv.Error as exc:
            raise DatasetFormatError(path, f"malformed CSV: {exc}", line=1) from None
        columns: dict[str, int] = {}
        for index, name in enumerate(header):
            columns.setdefault(name, index)
        missing = [c for c in required if c not in columns]
        if missing:
            raise DatasetFormatError(
                path, f"missing column {', '.join(repr(c) for c in missing)} (header: {', '.join(header)})", line=1
            )
        while True:
            start = reader.line_num + 1
            try:
                fields = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise DatasetFormatError(path, f"malformed CSV: {exc}", line=start) from None
            if not fields:
                continue  # a blank line
            if len(fields) != len(header):
                raise DatasetFormatError(
                    path, f"expected {len(header)} fields as in the header, found {len(fields)}", line=start
                )
            yield CsvRow(path, start, tuple(fields), header, columns)


def read_json(path: Path) -> Any:
    """Parse a whole JSON document (plain or gzip)."""
    with open_text(path) as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError as exc:
            raise DatasetFormatError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from None


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed object)`` for each non-blank line of a JSON-lines file."""
    with open_text(path) as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=number) from None
