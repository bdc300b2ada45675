"""Corpus files: JSONL, CSV and Parquet, read in chunks and written in parts, format from the extension.

Readers yield :class:`dialogue_safety.corpus.records.Row` chunks of at most ``chunk_size`` rows, so memory is
bounded by the chunk, never by the file; ``skip`` rows are passed over first (resuming). A
JSONL line that is not a JSON object becomes an error row naming file and line; blank lines
are not rows. CSV cells are strings (a history cell is a JSON list). Parquet (and anything
Ray) needs pyarrow: ``pip install 'dialogue-safety[scale]'``.

Writers write one part file per chunk (:func:`write_part`) and :func:`merge_parts` streams the
parts into the final file; nested values are objects in JSONL and JSON strings in CSV/Parquet
(:func:`dialogue_safety.corpus.records.flatten`).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dialogue_safety.core.limits import Limits
from dialogue_safety.corpus.records import Columns, Row, flatten, parse_row, unflatten, unreadable_row

FORMATS: dict[str, str] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


class CorpusFileError(ValueError):
    """A corpus file that cannot be read or written at all (not one bad row): names file and problem."""


def format_of(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise CorpusFileError(
            f"{path}: unknown format {suffix or '(no extension)'!r}; use one of {', '.join(sorted(FORMATS))}"
        )
    return FORMATS[suffix]


def require_readable_format(path: str | Path) -> str:
    """:func:`format_of`, and the library that format needs is installed (a job refused here leaves
    nothing behind: checked before any output is written)."""
    fmt = format_of(path)
    if fmt == "parquet":
        _pyarrow()
    return fmt


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as exc:
        raise CorpusFileError(
            f"Parquet needs pyarrow ({exc}): "
            "scripts/env.sh score (in a checkout), or pip install 'dialogue-safety[scale]'"
        ) from exc
    return pyarrow


def _csv_field_limit() -> None:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long comments are rows to judge, not a reader crash


# -- counting (for the progress bar) -----------------------------------------------------------
def count_rows(path: str | Path) -> int:
    """Rows in the file (JSONL: non-blank lines; CSV: records; Parquet: from the footer)."""
    fmt = format_of(path)
    if fmt == "parquet":
        return int(_pyarrow().parquet.ParquetFile(path).metadata.num_rows)
    if fmt == "csv":
        _csv_field_limit()
        with open(path, newline="", encoding="utf-8") as f:
            return max(0, sum(1 for _ in csv.reader(f)) - 1)
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


# -- reading -----------------------------------------------------------------------------------
def iter_rows(path: str | Path, columns: Columns, limits: Limits, skip: int = 0) -> Iterator[Row]:
    """Every row of the file after the first ``skip``, parsed (errors included, never dropped)."""
    fmt = format_of(path)
    name = Path(path).name
    if fmt == "jsonl":
        yield from _jsonl_rows(path, name, columns, limits, skip)
    elif fmt == "csv":
        yield from _csv_rows(path, name, columns, limits, skip)
    else:
        yield from _parquet_rows(path, name, columns, limits, skip)


def iter_chunks(
    path: str | Path, columns: Columns, limits: Limits, chunk_size: int, skip: int = 0
) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in iter_rows(path, columns, limits, skip):
        chunk.append(row)
        if len(chunk) >= chunk_size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _jsonl_rows(path: str | Path, name: str, columns: Columns, limits: Limits, skip: int) -> Iterator[Row]:
    seen = 0
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            seen += 1
            if seen <= skip:
                continue
            where = f"{name}:{line_no}"
            try:
                raw = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                yield unreadable_row(where, f"not valid JSON ({exc})")
                continue
            if not isinstance(raw, dict):
                yield unreadable_row(where, f"expected a JSON object, got {type(raw).__name__}")
                continue
            yield parse_row(raw, columns, limits, where)


def _csv_rows(path: str | Path, name: str, columns: Columns, limits: Limits, skip: int) -> Iterator[Row]:
    _csv_field_limit()
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return
        for seen, raw in enumerate(reader, start=1):
            if seen <= skip:
                continue
            where = f"{name}:{reader.line_num}"
            if None in raw:  # more cells than header names
                yield unreadable_row(
                    where,
                    f"{len(raw[None]) + len(reader.fieldnames)} cells for {len(reader.fieldnames)} columns",
                )
                continue
            yield parse_row(raw, columns, limits, where)


def _parquet_rows(path: str | Path, name: str, columns: Columns, limits: Limits, skip: int) -> Iterator[Row]:
    pq = _pyarrow().parquet
    try:
        reader = pq.ParquetFile(path)
    except Exception as exc:
        raise CorpusFileError(f"{path}: not a readable Parquet file ({exc})") from exc
    index = 0
    for batch in reader.iter_batches(batch_size=1024):
        n = batch.num_rows
        if index + n <= skip:
            index += n
            continue
        for offset, raw in enumerate(batch.to_pylist()):
            if index + offset < skip:
                continue
            yield parse_row(raw, columns, limits, f"{name}:row {index + offset + 1}")
        index += n


# -- writing -----------------------------------------------------------------------------------
def write_part(records: Sequence[Mapping[str, Any]], path: Path, fields: Sequence[str]) -> None:
    """Write one part atomically (a temporary file renamed into place)."""
    fmt = format_of(path)
    tmp = path.with_name(path.name + ".tmp")
    if fmt == "jsonl":
        with open(tmp, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps({k: r.get(k) for k in fields}, ensure_ascii=False) + "\n")
    elif fmt == "csv":
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(fields))
            writer.writeheader()
            writer.writerows(flatten({k: r.get(k) for k in fields}) for r in records)
    else:
        pa = _pyarrow()
        table = pa.Table.from_pylist([flatten({k: r.get(k) for k in fields}) for r in records])
        pa.parquet.write_table(table, tmp)
    os.replace(tmp, path)


def merge_parts(parts: Sequence[Path], out: Path, fields: Sequence[str]) -> None:
    """Stream ``parts`` (all in ``out``'s format) into ``out`` (a temporary file renamed into place)."""
    fmt = format_of(out)
    tmp = out.with_name(out.name + ".tmp")
    if fmt == "jsonl":
        with open(tmp, "wb") as dst:
            for p in parts:
                with open(p, "rb") as src:
                    shutil.copyfileobj(src, dst)
    elif fmt == "csv":
        with open(tmp, "w", newline="", encoding="utf-8") as dst:
            dst.write(",".join(_csv_quote(f) for f in fields) + "\r\n")
            for p in parts:
                with open(p, newline="", encoding="utf-8") as src:
                    src.readline()  # each part's header
                    shutil.copyfileobj(src, dst)
    else:
        pa = _pyarrow()
        pq = pa.parquet
        schemas = [pq.read_schema(p) for p in parts]
        schema = pa.unify_schemas(schemas, promote_options="permissive") if schemas else _empty_schema(pa, fields)
        with pq.ParquetWriter(tmp, schema) as writer:
            for p in parts:
                for batch in pq.ParquetFile(p).iter_batches():
                    writer.write_table(pa.Table.from_batches([batch]).cast(schema))
    os.replace(tmp, out)


def _csv_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"' if any(c in name for c in ',"\r\n') else name


def _empty_schema(pa: Any, fields: Sequence[str]) -> Any:
    return pa.schema([(f, pa.string()) for f in fields])


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """All records of an output file, nested values as objects (for tests and small files)."""
    fmt = format_of(path)
    if fmt == "jsonl":
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if fmt == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            return [unflatten({k: (v if v != "" else None) for k, v in r.items()}) for r in csv.DictReader(f)]
    return [unflatten(r) for r in _pyarrow().parquet.read_table(path).to_pylist()]
