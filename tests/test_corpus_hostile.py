"""No line stops a corpus job: lines nested thousands of brackets deep (JSONL, and a CSV history
cell), duplicate keys, bytes that are not UTF-8, lines longer than a row may be, rows with a bad
field: each becomes an error row naming file and line; blank lines are counted; an interrupted job
resumes past them. The tiny exported model with a real ONNX Runtime session."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.cli.score import main as score_main
from dialogue_safety.core.json_input import MAX_JSON_DEPTH, JsonInputError, loads, too_deep
from dialogue_safety.core.limits import Limits
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.corpus.formats import count_rows, read_records
from dialogue_safety.corpus.job import ScoreJob, run_local
from dialogue_safety.corpus.records import Columns

DEEP = 3000
SMALL_ROWS = Limits(max_body_bytes=20_000)  # a line over 20,000 bytes is longer than a row may be


class Counting:
    """The real classifier, counting what it scores (none twice after a resume)."""

    def __init__(self, inner: OnnxClassifier) -> None:
        self.inner, self.model_id = inner, inner.model_id
        self.scored: list[str] = []

    def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]:
        self.scored.extend(e.utterance for e in examples)
        return self.inner.predict(examples, threshold)


@pytest.fixture(scope="module")
def clf(tiny_model_dir: Path) -> OnnxClassifier:
    return OnnxClassifier(tiny_model_dir, variant="fp32")


def hostile_jsonl(path: Path) -> tuple[Path, dict[int, str]]:
    """A JSONL file of good and hostile lines; returns it and {line number: what its error says}."""
    lines = [
        json.dumps({"id": 1, "utterance": "have a nice day"}),  # 1
        "[" * DEEP + "]" * DEEP,  # 2: nested 3,000 deep
        json.dumps({"id": 3, "utterance": "hi", "history": json.loads("[" * 50 + "]" * 50)}),  # 3: a bad field
        "   \t ",  # 4: whitespace only
        '{"id": 5, "utterance": "fine", "utterance": "you idiot"}',  # 5: a key twice
        '{"id": 6, "utterance": "x", "history": ' + '{"a":' * DEEP + "1" + "}" * DEEP + "}",  # 6
        "",  # 7: blank
        json.dumps({"id": 8, "utterance": "y" * 25_000}),  # 8: longer than a row may be
        json.dumps({"id": 9, "utterance": "thanks, that helps"}),  # 9
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": 10, "utterance": "\xff\xfe"}\n')
    expected = {
        2: "nested deeper than",
        3: "history[0] must be a string",
        5: "appears twice",
        6: "nested deeper than",
        8: "longer than 20000 bytes",
        10: "not valid JSON",
    }
    return path, expected


def test_json_input_checks_depth_before_parsing_and_refuses_duplicate_keys() -> None:
    assert too_deep("[" * DEEP) and too_deep(b"[" * DEEP + b"]" * DEEP) and too_deep('{"a":' * DEEP)
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert not too_deep(at_limit) and loads(at_limit) is not None
    assert too_deep("[" + at_limit + "]")
    # brackets inside strings do not nest, escaped quotes do not end a string
    assert not too_deep(json.dumps(["[" * DEEP]))
    assert not too_deep(json.dumps(['\\"' + "{" * DEEP]))
    assert loads(json.dumps({"text": "[" * DEEP})) == {"text": "[" * DEEP}
    with pytest.raises(JsonInputError, match="nested deeper than 64"):
        loads("[" * DEEP + "]" * DEEP)
    with pytest.raises(JsonInputError, match='"b" appears twice'):
        loads('{"a": {"b": 1, "b": 2}}')
    with pytest.raises(json.JSONDecodeError):
        loads("{oops")


def test_hostile_jsonl_lines_become_error_rows_naming_file_and_line(
    tmp_path: Path, tiny_model_dir: Path, clf: OnnxClassifier
) -> None:
    inp, expected = hostile_jsonl(tmp_path / "in.jsonl")
    the_job = ScoreJob(inp, tmp_path / "out.jsonl", model_dir=tiny_model_dir, variant="fp32", chunk_size=3)
    summary = run_local(the_job, classifier=clf, limits=SMALL_ROWS, progress=False)
    assert (summary.rows, summary.errors, summary.scored, summary.blank_lines) == (8, 6, 2, 2)
    records = read_records(the_job.output)
    errors = [r["error"]["message"] for r in records if r["error"] is not None]
    for (line, what), message in zip(expected.items(), errors, strict=True):
        assert message.startswith(f"in.jsonl:{line}: ") and what in message, message
    assert [r["id"] for r in records if r["error"] is None] == [1, 9]
    assert count_rows(inp, SMALL_ROWS.max_body_bytes) == 8  # the progress bar's total: the same rows


def test_hostile_csv_records_become_error_rows_naming_file_and_line(
    tmp_path: Path, tiny_model_dir: Path, clf: OnnxClassifier
) -> None:
    inp = tmp_path / "in.csv"
    with open(inp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "utterance", "history"])
        writer.writerow(["1", "have a nice day", '["hello"]'])  # line 2
        writer.writerow(["2", "ok", "[" * DEEP + "]" * DEEP])  # 3: a history cell nested 3,000 deep
        f.write("   \n")  # 4: whitespace only
        writer.writerow(["4", "z" * 25_000, ""])  # 5: longer than a row may be
        writer.writerow(["5", "fine", '{"a": 1}'])  # 6: a history that is not a list
    with open(inp, "ab") as b:
        b.write(b"6,caf\xe9,\n")  # 7: Latin-1, not UTF-8
        b.write(b'7,"thanks, that helps",\n')  # 8
    the_job = ScoreJob(inp, tmp_path / "out.csv", model_dir=tiny_model_dir, variant="fp32", chunk_size=2)
    summary = run_local(the_job, classifier=clf, limits=SMALL_ROWS, progress=False)
    assert (summary.rows, summary.errors, summary.blank_lines) == (6, 4, 1)
    records = read_records(the_job.output)
    by_line = {
        3: ("invalid_history", "nested deeper than"),
        5: ("unreadable_row", "longer than 20000 characters"),
        6: ("invalid_history", "must be a list of turns"),
        7: ("unreadable_row", "not UTF-8"),
    }
    errors = [r["error"] for r in records if r["error"] is not None]
    for (line, (code, what)), error in zip(by_line.items(), errors, strict=True):
        assert error["code"] == code and error["message"].startswith(f"in.csv:{line}: ") and what in error["message"]
    assert errors[0]["field"] == "history"  # the deep cell: the field at fault is named
    assert [r["id"] for r in records if r["error"] is None] == ["1", "7"]


def test_a_job_interrupted_around_a_hostile_line_resumes_past_it(
    tmp_path: Path, tiny_model_dir: Path, clf: OnnxClassifier
) -> None:
    inp, _ = hostile_jsonl(tmp_path / "in.jsonl")
    the_job = ScoreJob(inp, tmp_path / "out.parquet", model_dir=tiny_model_dir, variant="fp32", chunk_size=2)

    def stop_after_two(done: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    counting = Counting(clf)
    with pytest.raises(KeyboardInterrupt):
        run_local(the_job, classifier=counting, limits=SMALL_ROWS, progress=False, on_chunk=stop_after_two)
    summary = run_local(the_job, classifier=counting, limits=SMALL_ROWS, progress=False)
    assert (summary.resumed_rows, summary.rows, summary.errors, summary.blank_lines) == (4, 8, 6, 2)
    assert sorted(counting.scored) == ["have a nice day", "thanks, that helps"]  # each good row once
    assert [r["error"] is None for r in read_records(the_job.output)] == [True, *[False] * 5, True, False]


def test_the_score_command_reports_blank_lines_and_survives_a_deep_line(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"utterance": "hello"}\n\n' + "[" * DEEP + "]" * DEEP + "\n  \n")
    code = score_main([str(inp), str(tmp_path / "out.jsonl"), "--model", str(tiny_model_dir), "--no-progress"])
    assert code == 0
    summary: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["errors"], summary["blank_lines"]) == (2, 1, 2)


# -- CSV records: rows in = data rows + error rows --------------------------------------------------------
ROW_LIMIT = Limits(max_body_bytes=1000)  # SAFETY_MAX_BODY_BYTES=1000: a record over 1,000 characters is too long
# (id, the record as written, whether it is an error row): every record is one row out, whatever it holds
HOSTILE_CSV = [
    ("1", "1,have a nice day\n", False),
    ("2", '2,"' + "a" * 3000 + ' line"\n', True),  # an over-long quoted field: the cut falls inside the quotes
    ("3", "3,hello\n", False),
    ("4", '4,"broken\n', True),  # an unterminated quote, "closed" by the quote that opens record 6
    ("5", "5,world\n", False),
    ("6", '6,"multi\nline\ntext"\n', False),  # embedded newlines, well quoted
    ("7", "7,x\x00y\n", False),  # a NUL byte
    ("8", '8,"' + "b" * 800 + "\n" + "c" * 800 + '"\n', True),  # over-long, over two lines
    ("9", '9,"he said ""hi"""\n', False),
    ("10", '10,"x\x00""y"""\n', False),  # a NUL byte inside quotes
    ("11", '11,"never closed\n', True),  # the file ends before its quote closes
    ("12", "12,the last one\n", False),
]


def test_hostile_csv_loses_no_record_rows_in_are_data_rows_plus_error_rows(
    tmp_path: Path, tiny_model_dir: Path, clf: OnnxClassifier
) -> None:
    inp = tmp_path / "in.csv"
    inp.write_text("id,utterance\n" + "".join(text for _, text, _ in HOSTILE_CSV), encoding="utf-8")
    lines, first_line = 2, {}
    for rid, text, _ in HOSTILE_CSV:
        first_line[rid] = lines
        lines += text.count("\n")
    the_job = ScoreJob(inp, tmp_path / "out.jsonl", model_dir=tiny_model_dir, variant="fp32", chunk_size=5)
    summary = run_local(the_job, classifier=clf, limits=ROW_LIMIT, progress=False)
    bad = [rid for rid, _, is_error in HOSTILE_CSV if is_error]
    assert (summary.rows, summary.errors) == (len(HOSTILE_CSV), len(bad))
    assert count_rows(inp, ROW_LIMIT.max_body_bytes) == len(HOSTILE_CSV)  # the progress bar counts the same
    records = read_records(the_job.output)
    assert [r["id"] for r in records if r["error"] is None] == [rid for rid, _, e in HOSTILE_CSV if not e]
    errors = [r["error"]["message"] for r in records if r["error"] is not None]
    for rid, message in zip(bad, errors, strict=True):
        assert message.startswith(f"in.csv:{first_line[rid]}: "), (rid, message)
    assert "never closed" in errors[3] and "reading goes on at line" in errors[3]
    assert "followed by other text" in errors[1]


@pytest.mark.parametrize("cut", [500, 999, 1000, 1001, 1500, 2999, 3003])
def test_a_quoted_field_cut_anywhere_keeps_the_next_record(tmp_path: Path, cut: int) -> None:
    """The cut of an over-long record, wherever it falls inside (or just after) its quotes, ends that
    record only: the next record is read whole, and nothing is made up from the rest of the line."""
    from dialogue_safety.corpus.formats import iter_rows
    from dialogue_safety.corpus.records import Columns

    inp = tmp_path / "in.csv"
    inp.write_text(f'id,utterance\n1,"{"x" * cut}, still ""quoted"" line"\n2,next\n3,"a\nb"\n')
    rows = list(iter_rows(inp, Columns(), ROW_LIMIT))
    long = cut + len(', still ""quoted"" line') + 5 > ROW_LIMIT.max_body_bytes
    assert [r.raw.get("id") for r in rows] == [None if long else "1", "2", "3"]
    assert (rows[0].error is not None) is long


def test_ids_too_large_for_a_float_are_written_as_strings_in_strict_json(tmp_path: Path, clf: OnnxClassifier) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        '{"id": 1e400, "utterance": "hi"}\n{"id": -1e999, "utterance": "hi"}\n'
        '{"id": NaN, "utterance": "hi"}\n{"id": 2.5, "utterance": "hi"}\n'
    )
    the_job = ScoreJob(inp, tmp_path / "out.jsonl", variant="fp32")
    run_local(the_job, classifier=clf, progress=False)

    def strict(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    lines = the_job.output.read_text().splitlines()
    assert [json.loads(line, parse_constant=strict)["id"] for line in lines] == ["1e400", "-1e999", "NaN", 2.5]


def test_a_csv_with_a_byte_order_mark_keeps_its_first_column(tmp_path: Path, clf: OnnxClassifier) -> None:
    """Excel's "CSV UTF-8" starts with a BOM: the first header is still ``id``, not ``\\ufeffid``."""
    inp = tmp_path / "excel.csv"
    inp.write_bytes(b"\xef\xbb\xbfid,text\r\nr1,hello there\r\nr2,you idiot\r\n")
    the_job = ScoreJob(inp, tmp_path / "out.jsonl", variant="fp32")
    assert run_local(the_job, classifier=clf, progress=False).errors == 0
    assert [json.loads(line)["id"] for line in the_job.output.read_text().splitlines()] == ["r1", "r2"]


def test_carried_values_that_cannot_be_written_are_error_rows_and_mixed_types_are_kept_as_text(
    tmp_path: Path, clf: OnnxClassifier
) -> None:
    """A carried id with a lone surrogate (a JSON escape such as "\\udc80") cannot be written as UTF-8: its row is
    an error row naming the field, and the job goes on. Ids of several types, in one chunk or across chunks, are
    written to Parquet as text where Arrow has no one type for them; nested carried values are JSON in CSV."""
    inp = tmp_path / "in.jsonl"
    inp.write_text(
        '{"id": "\\udc80", "utterance": "hello"}\n{"id": 1, "utterance": "hi"}\n{"id": "b", "utterance": "hey"}\n'
        '{"id": 2.5, "utterance": "yo", "meta": {"a": [1, "x"], "ok": true}}\n'
    )
    for chunk_size in (1, 4):
        out = tmp_path / f"out-{chunk_size}.parquet"
        summary = run_local(ScoreJob(inp, out, variant="fp32", chunk_size=chunk_size), classifier=clf, progress=False)
        assert summary.rows == 4 and summary.errors == 1
        rows = read_records(out)
        assert [r["id"] for r in rows] == [None, "1", "b", "2.5"], chunk_size
        assert rows[0]["error"]["code"] == "invalid_text" and rows[0]["error"]["field"] == "id"
    out = tmp_path / "out.csv"
    run_local(ScoreJob(inp, out, variant="fp32", columns=Columns(carry=("meta",))), classifier=clf, progress=False)
    with open(out, newline="", encoding="utf-8") as f:
        meta = [r["meta"] for r in csv.DictReader(f)]
    assert json.loads(meta[3]) == {"a": [1, "x"], "ok": True}


def test_a_line_handed_over_whole_is_refused_when_longer_than_a_row_may_be() -> None:
    """Ray hands each JSONL line over as text (the local engine reads past a long one unheld): the same limit, in
    UTF-8 bytes, makes it an error row there too."""
    from dialogue_safety.corpus.formats import parse_jsonl_line

    limits = Limits(max_body_bytes=100)
    fits = json.dumps({"utterance": "é" * 40}, ensure_ascii=False)  # 40 characters, 80 bytes of them
    over = json.dumps({"utterance": "é" * 45}, ensure_ascii=False)  # 45 characters, 90 bytes: with the rest > 100
    assert parse_jsonl_line(fits, "JSONL line", Columns(), limits).error is None
    row = parse_jsonl_line(over, "JSONL line", Columns(), limits)
    assert row.error is not None and row.error.code == "unreadable_row" and "longer than 100 bytes" in row.error.message
    assert parse_jsonl_line(over.encode(), "JSONL line", Columns(), limits).error is not None
