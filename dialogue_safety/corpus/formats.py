"""Corpus files: JSONL, CSV and Parquet, read in chunks and written in parts, format from the extension.

Readers yield :class:`dialogue_safety.corpus.records.Row` chunks of at most ``chunk_size`` rows, so memory is
bounded by the chunk, never by the file; ``skip`` rows are passed over first (resuming). No line
stops a job: a JSONL line that is not a JSON object (or nests deeper than
:data:`dialogue_safety.core.json_input.MAX_JSON_DEPTH`, checked before it is parsed, or holds a key
twice), a CSV record that is not readable CSV or not UTF-8, and a line longer than a request body may
be (``Limits.max_body_bytes``, never held whole) each become an error row naming file and line.
Blank (or whitespace-only) lines are not rows; they are counted (:class:`ReadCounts`). CSV cells are
strings (a history cell is a JSON list). Parquet (and anything Ray) needs pyarrow:
``pip install 'dialogue-safety[scale]'``.

Writers write one part file per chunk (:func:`write_part`) and :func:`merge_parts` streams the
parts into the final file; nested values are objects in JSONL and JSON strings in CSV/Parquet
(:func:`dialogue_safety.corpus.records.flatten`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dialogue_safety.core import json_input
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
    # a cell is never longer than its record, which is held only up to the row limit (_csv_records)
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


@dataclass
class ReadCounts:
    """What reading a file passed over without making a row of it (reported in the job's summary)."""

    blank_lines: int = 0  # blank or whitespace-only lines (JSONL) or records (CSV)


READ_PIECE = 1 << 20  # how much of an over-long line is read at a time while it is passed over
_SURROGATE = re.compile("[\ud800-\udfff]")  # what surrogateescape makes of bytes that are not UTF-8


def _too_long(where: str, max_bytes: int) -> Row:
    return unreadable_row(
        where,
        f"the line is longer than {max_bytes} bytes, the most one row may hold (a request body's limit, "
        "SAFETY_MAX_BODY_BYTES); it was not read",
    )


def _binary_lines(f: IO[bytes], max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line) of a binary file; a line longer than ``max_bytes`` comes as None (it is
    read past in pieces, never held whole)."""
    line_no = 0
    while line := f.readline(max_bytes + 1):
        line_no += 1
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while (rest := f.readline(READ_PIECE)) and not rest.endswith(b"\n"):
                pass
            yield line_no, None
        else:
            yield line_no, line


# Where a CSV record ends: at a line end outside quotes. The states of the csv module's reader (the excel
# dialect, not strict) that decide it: a quote opens a quoted field only at the start of a field, a quote in
# a quoted field ends it unless doubled, and one anywhere else is a plain character.
_FIELD_START, _UNQUOTED, _QUOTED, _QUOTE_IN_QUOTED = range(4)


def _scan(text: str, state: int) -> tuple[int, bool]:
    """The reader's state after ``text`` (part of a record, without its line end), from ``state``, and
    whether a quoted field closed there is followed by other text (``"a"b``: not where a field can end,
    so the quote that closed it is likely one that opened the next record)."""
    if '"' not in text:  # the common line: no quote to open or close
        if state == _QUOTED or not text:
            return state, False
        stray = state == _QUOTE_IN_QUOTED and text[0] != ","
        return (_FIELD_START if text.endswith(",") else _UNQUOTED), stray
    stray = False
    i, n = 0, len(text)
    while i < n:
        if state == _QUOTED:
            j = text.find('"', i)
            if j < 0:
                return _QUOTED, stray
            state, i = _QUOTE_IN_QUOTED, j + 1
        elif state == _UNQUOTED:
            j = text.find(",", i)
            if j < 0:
                return _UNQUOTED, stray
            state, i = _FIELD_START, j + 1
        else:  # at a field's start, or just after a quote in a quoted field: the next character decides
            c = text[i]
            stray = stray or (state == _QUOTE_IN_QUOTED and c not in '",')
            state = _QUOTED if c == '"' else _FIELD_START if c == "," else _UNQUOTED
            i += 1
    return state, stray


def _csv_records(
    f: IO[str], max_chars: int, counts: ReadCounts | None = None
) -> Iterator[tuple[int, list[str] | None, str | None]]:
    """(first line, cells, problem) of every CSV record that is not blank: cells None with the problem
    of a record that cannot be read (not CSV, longer than ``max_chars``, not UTF-8, a quote never closed).

    Records are cut where the csv module would cut them (a line end outside quotes), found by a scan that
    holds at most ``max_chars`` characters: a longer record is read past, to its real end, even when the
    cut falls inside quotes. A record over several lines whose quote is never closed (the file ends first),
    or is closed by a quote followed by other text (``"a"b``: likely the quote that opens a later record),
    has no end to trust: it becomes an error row for its first line, and reading goes back to the next
    line, so one stray quote costs one row, never the records after it. (Finding that out reads on to the
    file's end, or to the stray quote, once per such record.)"""
    line = 1  # the line the next read starts on
    while True:
        first, size, state, stray = line, 0, _FIELD_START, False
        held: list[str] | None = []  # None: longer than max_chars, read past
        resume: tuple[int, int] | None = None  # (position, line) after the record's first line
        ended = False
        while True:
            piece = f.readline(max_chars + 1 - size if held is not None else READ_PIECE)
            if not piece:
                break  # the end of the file
            body = piece.rstrip("\r\n")
            state, stray_here = _scan(body, state)
            stray = stray or stray_here
            if held is not None:
                size += len(piece)
                if size > max_chars:
                    held = None
                else:
                    held.append(piece)
            if len(body) != len(piece):  # a line end
                line += 1
                if state != _QUOTED:
                    ended = True
                    break
                if resume is None:
                    resume = (f.tell(), line)
        if not ended and held == []:
            return  # nothing left
        unclosed = not ended and state == _QUOTED
        if resume is not None and (unclosed or stray):
            f.seek(resume[0])
            line = resume[1]
            why = "is never closed (the file ends first)" if unclosed else "is closed by a quote followed by other text"
            yield (
                first,
                None,
                (
                    f"a quoted field opened on this line {why}, so the record has no end to trust: it is taken to end "
                    f"with this line, and reading goes on at line {line}"
                ),
            )
            continue
        if unclosed:
            yield first, None, "a quoted field opened on this line is never closed (the file ends first)"
            continue
        if held is None:
            yield (
                first,
                None,
                f"the record is longer than {max_chars} characters, the most one row may hold "
                "(a request body's limit, SAFETY_MAX_BODY_BYTES); it was not read",
            )
            continue
        try:
            cells = next(csv.reader(held))
        except (csv.Error, StopIteration) as exc:
            yield first, None, f"not a readable CSV record ({exc})"
            continue
        if len(cells) <= 1 and not "".join(cells).strip():
            if counts is not None:
                counts.blank_lines += 1
        elif any(_SURROGATE.search(c) for c in cells):
            yield first, None, "not UTF-8 text"
        else:
            yield first, cells, None


def _open_csv(path: str | Path) -> IO[str]:
    _csv_field_limit()
    return open(path, newline="", encoding="utf-8-sig", errors="surrogateescape")  # a BOM (Excel) is not a header


# -- counting (for the progress bar) -----------------------------------------------------------
def count_rows(path: str | Path, max_row_bytes: int | None = None) -> int:
    """Rows in the file (JSONL: non-blank lines; CSV: non-blank records; Parquet: from the footer);
    ``max_row_bytes``: as the rows are read (default: ``Limits().max_body_bytes``)."""
    fmt = format_of(path)
    max_row_bytes = max_row_bytes or Limits().max_body_bytes
    if fmt == "parquet":
        return int(_pyarrow().parquet.ParquetFile(path).metadata.num_rows)
    if fmt == "csv":
        with _open_csv(path) as f:
            return max(0, sum(1 for _ in _csv_records(f, max_row_bytes)) - 1)
    with open(path, "rb") as f:
        return sum(1 for _, line in _binary_lines(f, max_row_bytes) if line is None or line.strip())


# -- reading -----------------------------------------------------------------------------------
def iter_rows(
    path: str | Path, columns: Columns, limits: Limits, skip: int = 0, counts: ReadCounts | None = None
) -> Iterator[Row]:
    """Every row of the file after the first ``skip``, parsed (errors included, never dropped);
    ``counts``: what was passed over (every blank line of the file, skipped rows' included)."""
    fmt = format_of(path)
    name = Path(path).name
    counts = counts if counts is not None else ReadCounts()
    if fmt == "jsonl":
        yield from _jsonl_rows(path, name, columns, limits, skip, counts)
    elif fmt == "csv":
        yield from _csv_rows(path, name, columns, limits, skip, counts)
    else:
        yield from _parquet_rows(path, name, columns, limits, skip)


def iter_chunks(
    path: str | Path,
    columns: Columns,
    limits: Limits,
    chunk_size: int,
    skip: int = 0,
    counts: ReadCounts | None = None,
) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in iter_rows(path, columns, limits, skip, counts):
        chunk.append(row)
        if len(chunk) >= chunk_size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _number(text: str) -> float | str:
    """A JSON number with a fraction or exponent; one too large for a float (``1e400``) stays its text, as do
    ``NaN`` and ``Infinity`` (``parse_constant``): an id is carried as it was written, never as a value
    that strict JSON cannot write."""
    value = float(text)
    return value if math.isfinite(value) else text


def _json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite (a Parquet input's, say) as its JSON name, a string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _json_line(record: Mapping[str, Any], fields: Sequence[str]) -> str:
    """One output record as a strict JSON line (no ``NaN``/``Infinity``: non-finite floats are written as strings)."""
    values = {k: record.get(k) for k in fields}
    try:
        return json.dumps(values, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return json.dumps(_json_safe(values), ensure_ascii=False, allow_nan=False)


def parse_jsonl_line(line: str | bytes, where: str, columns: Columns, limits: Limits) -> Row:
    """One JSONL line → its row, or an error row naming ``where`` (both engines read lines here; a line longer
    than a row may be is one: the local engine reads past it unheld, Ray hands it over whole)."""
    if _bytes_over(line, limits.max_body_bytes):
        return _too_long(where, limits.max_body_bytes)
    try:
        raw = json_input.loads(line, parse_float=_number, parse_constant=str)
    except json_input.JsonInputError as exc:
        return unreadable_row(where, f"not a JSON line to read ({exc})")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return unreadable_row(where, f"not valid JSON ({exc})")
    if not isinstance(raw, dict):
        return unreadable_row(where, f"expected a JSON object, got {type(raw).__name__}")
    return parse_row(raw, columns, limits, where)


def _bytes_over(line: str | bytes, limit: int) -> bool:
    if isinstance(line, bytes) or len(line) > limit or 4 * len(line) <= limit:  # UTF-8: 1 to 4 bytes a character
        return len(line) > limit
    return len(line.encode("utf-8", "surrogatepass")) > limit


def _jsonl_rows(
    path: str | Path, name: str, columns: Columns, limits: Limits, skip: int, counts: ReadCounts
) -> Iterator[Row]:
    seen = 0
    with open(path, "rb") as f:
        for line_no, line in _binary_lines(f, limits.max_body_bytes):
            if line is not None and not line.strip():
                counts.blank_lines += 1
                continue
            seen += 1
            if seen <= skip:
                continue
            where = f"{name}:{line_no}"
            yield (
                _too_long(where, limits.max_body_bytes)
                if line is None
                else parse_jsonl_line(line, where, columns, limits)
            )


def _csv_rows(
    path: str | Path, name: str, columns: Columns, limits: Limits, skip: int, counts: ReadCounts
) -> Iterator[Row]:
    with _open_csv(path) as f:
        records = _csv_records(f, limits.max_body_bytes, counts)
        header = next(records, None)
        if header is None:
            return
        line, fieldnames, problem = header
        if fieldnames is None:
            raise CorpusFileError(f"{path}:{line}: the header is not readable ({problem})")
        for seen, (line, cells, problem) in enumerate(records, start=1):
            if seen <= skip:
                continue
            where = f"{name}:{line}"
            if cells is None:
                yield unreadable_row(where, str(problem))
            elif len(cells) > len(fieldnames):  # more cells than header names
                yield unreadable_row(where, f"{len(cells)} cells for {len(fieldnames)} columns")
            else:
                raw = {k: (cells[i] if i < len(cells) else None) for i, k in enumerate(fieldnames)}
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
                f.write(_json_line(r, fields) + "\n")
    elif fmt == "csv":
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(fields))
            writer.writeheader()
            writer.writerows(flatten({k: r.get(k) for k in fields}, text_only=True) for r in records)
    else:
        pa = _pyarrow()
        pa.parquet.write_table(_parquet_table(pa, [flatten({k: r.get(k) for k in fields}) for r in records]), tmp)
    os.replace(tmp, path)


def _parquet_table(pa: Any, rows: list[dict[str, Any]]) -> Any:
    """``rows`` as an Arrow table; a column whose values have several types (a carried id that is 1 in one row and
    "b" in another) as text, each value as its JSON (no row stops the job for its neighbours' types)."""
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        mixed = {k for k in (rows[0] if rows else {}) if len({type(r[k]) for r in rows if r[k] is not None}) > 1}
        return pa.Table.from_pylist([{k: (_as_text(v) if k in mixed else v) for k, v in r.items()} for r in rows])


def _as_text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else json.dumps(value, ensure_ascii=False)


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
        schema = _merged_schema(pa, schemas) if schemas else _empty_schema(pa, fields)
        with pq.ParquetWriter(tmp, schema) as writer:
            for p in parts:
                for batch in pq.ParquetFile(p).iter_batches():
                    writer.write_table(pa.Table.from_batches([batch]).cast(schema))
    os.replace(tmp, out)


def _merged_schema(pa: Any, schemas: Sequence[Any]) -> Any:
    """One schema for every part: their types promoted where Arrow can (int and float, null and a type); a column
    whose parts disagree otherwise (a carried id as integers in one part, text in another) as text."""
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except pa.ArrowTypeError:
        fields = []
        for f in schemas[0]:
            one = [pa.schema([s.field(f.name)]) for s in schemas]
            try:
                fields.append(pa.unify_schemas(one, promote_options="permissive").field(0))
            except pa.ArrowTypeError:
                fields.append(pa.field(f.name, pa.string()))
        return pa.schema(fields)


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
