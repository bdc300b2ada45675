"""``dialogue-safety score``: formats, columns, error rows, resuming, explanations, and the same
scores as the API, on the tiny exported model with a real ONNX Runtime session and a real server."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_conftest import live_server, tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.cli.score import main as score_main
from dialogue_safety.core.limits import Limits
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.corpus.formats import CorpusFileError, read_records
from dialogue_safety.corpus.job import ScoreJob, run_local
from dialogue_safety.corpus.records import Columns

ROWS: list[dict[str, Any]] = [
    {"id": 1, "utterance": "you are a stupid idiot", "history": ["hello there"]},
    {"id": 2, "text": "have a nice day"},
    {"id": 3, "utterance": "   "},
    {"id": 4, "utterance": "ok then", "history": '["what?", {"speaker": "bot", "text": "no"}]'},
    {"id": 5, "utterance": "fine", "history": "not json"},
    {"id": 6, "utterance": "x" * 5000},
    {"id": 7, "history": ["no utterance here"]},
    {"id": 8, "utterance": "the cat sat on the mat", "history": [{"speaker": "user", "text": "tell me a story"}]},
]
GOOD_IDS = [1, 2, 4, 8]
ERROR_CODES = {3: "empty_utterance", 5: "invalid_history", 6: "utterance_too_long", 7: "missing_utterance"}


class CountingClassifier:
    """The real OnnxClassifier, counting every example it scores (to prove none is scored twice)."""

    def __init__(self, inner: OnnxClassifier) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.scored: list[str] = []

    def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]:
        self.scored.extend(e.utterance for e in examples)
        return self.inner.predict(examples, threshold)


@pytest.fixture(scope="module")
def clf(tiny_model_dir: Path) -> OnnxClassifier:
    return OnnxClassifier(tiny_model_dir, variant="fp32")


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]], bad_lines: Sequence[str] = ()) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in bad_lines:
            f.write(line + "\n")
    return path


def as_cells(row: dict[str, Any]) -> dict[str, str]:
    return {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in row.items()}


def write_input(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    if path.suffix == ".jsonl":
        return write_jsonl(path, rows)
    names = ["id", "utterance", "text", "history"]
    if path.suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=names)
            writer.writeheader()
            writer.writerows({"id": str(r["id"]), **{k: v for k, v in as_cells(r).items() if k != "id"}} for r in rows)
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(
        [{"id": r["id"], **{k: as_cells(r).get(k) for k in names[1:]}} for r in rows],
        schema=pa.schema([("id", pa.int64()), *((n, pa.string()) for n in names[1:])]),
    )
    pq.write_table(table, path)
    return path


def job(tmp: Path, inp: Path, out: str, model: Path, **kw: Any) -> ScoreJob:
    return ScoreJob(inp, tmp / out, model_dir=model, variant="fp32", **kw)


def check_records(records: list[dict[str, Any]], clf: OnnxClassifier, columnar: bool = False) -> None:
    assert [str(r["id"]) for r in records] == [str(r["id"]) for r in ROWS]  # every row, in order
    by_id = {int(r["id"]): r for r in records}
    codes = {**ERROR_CODES, 7: "empty_utterance"} if columnar else ERROR_CODES  # a CSV/Parquet cell is never absent
    for i, code in codes.items():
        r = by_id[i]
        assert r["error"]["code"] == code and r["error"]["message"], r
        assert r["score"] is None and r["label"] is None
    expected = clf.predict(
        [
            Example.from_texts("you are a stupid idiot", ["hello there"]),
            Example.from_texts("have a nice day"),
            Example.from_texts("ok then", ["what?", "no"]),
            Example.from_texts("the cat sat on the mat", ["tell me a story"]),
        ]
    )
    for i, p in zip(GOOD_IDS, expected, strict=True):
        r = by_id[i]
        assert r["error"] is None
        assert float(r["score"]) == pytest.approx(p.score, abs=1e-6)
        assert r["label"] == p.label.value and r["categories"].keys() == p.categories.keys()


@pytest.mark.parametrize("in_ext", [".jsonl", ".csv", ".parquet"])
@pytest.mark.parametrize("out_ext", [".jsonl", ".csv", ".parquet"])
def test_every_format_in_and_out(
    tmp_path: Path,
    clf: OnnxClassifier,
    tiny_model_dir: Path,
    in_ext: str,
    out_ext: str,
) -> None:
    inp = write_input(tmp_path / f"in{in_ext}", ROWS)
    summary = run_local(job(tmp_path, inp, f"out{out_ext}", tiny_model_dir, chunk_size=3), progress=False)
    assert (summary.rows, summary.scored, summary.errors) == (8, 4, 4)
    check_records(read_records(tmp_path / f"out{out_ext}"), clf, columnar=in_ext != ".jsonl")
    assert not (tmp_path / f"out{out_ext}.parts").exists()


def test_unreadable_lines_are_error_rows_naming_file_and_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS[:2], bad_lines=["", "{oops", "[1, 2]"])
    summary = run_local(job(tmp_path, inp, "out.jsonl", tiny_model_dir), progress=False)
    records = read_records(tmp_path / "out.jsonl")
    assert summary.rows == 4 and summary.errors == 2  # the blank line is not a row
    assert (
        records[2]["error"]["code"] == "unreadable_row"
        and "in.jsonl:4: not valid JSON" in records[2]["error"]["message"]
    )
    assert "in.jsonl:5: expected a JSON object" in records[3]["error"]["message"]


def test_columns_are_configurable_and_carried(tmp_path: Path, tiny_model_dir: Path) -> None:
    rows = [{"msg_id": "a7", "body": "hello", "ctx": ["hi"], "lang": "en"}, {"msg_id": "b8", "body": "", "lang": "de"}]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    columns = Columns(utterance="body", history="ctx", id="msg_id", carry=("lang",))
    run_local(job(tmp_path, inp, "out.csv", tiny_model_dir, columns=columns), progress=False)
    with open(tmp_path / "out.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == ["msg_id", "lang", "label", "score", "threshold", "categories", "windows", "truncated", "error"]
    records = read_records(tmp_path / "out.csv")
    assert [(r["msg_id"], r["lang"]) for r in records] == [("a7", "en"), ("b8", "de")]
    assert records[1]["error"]["code"] == "empty_utterance"


def test_same_scores_as_the_api(tmp_path: Path, tiny_model_dir: Path) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    run_local(job(tmp_path, inp, "out.jsonl", tiny_model_dir, chunk_size=2), progress=False)
    records = read_records(tmp_path / "out.jsonl")
    items: list[Any] = []
    for r in ROWS:
        history = r.get("history", [])
        if r["id"] == 4:
            history = json.loads(history)  # the API takes the list itself, a file may hold it as JSON text
        items.append({"utterance": r.get("utterance", r.get("text")), "history": history})
    with live_server(model_dir=tiny_model_dir, variant="fp32") as live, live.client() as c:
        for i in GOOD_IDS:
            api = c.post("/v1/classify", json=items[i - 1]).json()
            mine = records[i - 1]
            assert (mine["score"], mine["label"], mine["threshold"], mine["categories"]) == (
                api["score"],
                api["label"],
                api["threshold"],
                api["categories"],
            )
        batch = c.post("/v1/classify/batch", json={"items": [items[i - 1] for i in (1, 3, 6)]}).json()
    assert records[0]["score"] == batch["results"][0]["score"]
    # an item the API refuses is an error row with the same code
    assert records[2]["error"]["code"] == batch["results"][1]["error"]["code"] == "empty_utterance"
    assert records[5]["error"]["code"] == batch["results"][2]["error"]["code"] == "utterance_too_long"


def test_an_interrupted_job_resumes_without_scoring_a_row_twice(
    tmp_path: Path,
    clf: OnnxClassifier,
    tiny_model_dir: Path,
) -> None:
    rows = [{"id": i, "utterance": f"message number {i} " + "word " * (i % 7)} for i in range(23)]
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    reference = run_local(
        job(tmp_path, inp, "ref.parquet", tiny_model_dir, chunk_size=5), classifier=clf, progress=False
    )
    assert reference.rows == 23

    def stop_after_two(done: int) -> None:
        if done == 2:
            raise KeyboardInterrupt

    counting = CountingClassifier(clf)
    the_job = job(tmp_path, inp, "out.parquet", tiny_model_dir, chunk_size=5)
    with pytest.raises(KeyboardInterrupt):
        run_local(the_job, classifier=counting, progress=False, on_chunk=stop_after_two)
    assert not the_job.output.exists() and the_job.parts_dir.is_dir()
    assert len(counting.scored) == 10
    summary = run_local(the_job, classifier=counting, progress=False)
    assert summary.resumed_rows == 10 and summary.rows == 23
    assert sorted(counting.scored) == sorted(r["utterance"] for r in rows)  # each row exactly once
    assert read_records(the_job.output) == read_records(tmp_path / "ref.parquet")


def test_an_interrupt_just_after_the_first_part_keeps_it(
    tmp_path: Path,
    clf: OnnxClassifier,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGINT between the first part's stats file and the loop's bookkeeping (the progress bar's update):
    the part is complete on disk, so it is kept and resumed, not thrown away as 'nothing written yet'."""
    import tqdm.auto

    inp = write_jsonl(tmp_path / "in.jsonl", [{"utterance": f"row {i}"} for i in range(6)])
    the_job = job(tmp_path, inp, "out.jsonl", tiny_model_dir, chunk_size=2)

    class InterruptedBar(tqdm.auto.tqdm):
        def update(self, n: float | None = 1) -> bool | None:
            raise KeyboardInterrupt

    monkeypatch.setattr(tqdm.auto, "tqdm", InterruptedBar)  # run_local imports its bar when it runs
    with pytest.raises(KeyboardInterrupt):
        run_local(the_job, classifier=clf, progress=False)
    monkeypatch.undo()
    kept = sorted(p.name for p in the_job.parts_dir.iterdir())
    assert "part-000000.jsonl" in kept and "part-000000.stats.json" in kept, kept
    assert not [name for name in kept if name.endswith(".tmp")], kept
    summary = run_local(the_job, classifier=clf, progress=False)
    assert summary.resumed_rows == 2 and summary.rows == 6


def test_a_different_job_does_not_resume_silently(
    tmp_path: Path,
    clf: OnnxClassifier,
    tiny_model_dir: Path,
) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", [{"utterance": f"row {i}"} for i in range(6)])
    first = job(tmp_path, inp, "out.jsonl", tiny_model_dir, chunk_size=2)

    def stop(done: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_local(first, classifier=clf, progress=False, on_chunk=stop)
    other = job(tmp_path, inp, "out.jsonl", tiny_model_dir, chunk_size=3)
    with pytest.raises(CorpusFileError, match="chunk_size.*--restart"):
        run_local(other, classifier=clf, progress=False)
    with pytest.raises(CorpusFileError, match="limits.*--restart"):  # the same job under other request limits
        run_local(first, classifier=clf, progress=False, limits=Limits(max_utterance_chars=3))
    summary = run_local(other, classifier=clf, progress=False, restart=True)
    assert summary.resumed_rows == 0 and summary.rows == 6


def test_explanations_in_the_output(tmp_path: Path, clf: OnnxClassifier, tiny_model_dir: Path) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS[:3])
    run_local(job(tmp_path, inp, "out.parquet", tiny_model_dir, explain=True, explain_history=True), progress=False)
    records = read_records(tmp_path / "out.parquet")
    ex = records[0]["explanation"]
    assert ex["score"] == records[0]["score"]
    assert [w["word"] for w in ex["utterance"]] == ["you", "are", "a", "stupid", "idiot"]
    assert [w["word"] for w in ex["history"][0]] == ["hello", "there"]
    assert ex["method"] == "shapley"  # the default; efficient: the shares add up to score - baseline
    shares = [w["contribution"] for w in ex["utterance"]] + [w["contribution"] for t in ex["history"] for w in t]
    assert sum(shares) == pytest.approx(records[0]["score"] - ex["baseline"], abs=1e-6)
    assert records[2]["explanation"] is None and records[2]["error"]["code"] == "empty_utterance"
    # leave one out on request: each contribution is the drop without that word
    explain_job = job(tmp_path, inp, "loo.jsonl", tiny_model_dir, explain=True, explain_method="occlusion")
    run_local(explain_job, progress=False)
    ex = read_records(tmp_path / "loo.jsonl")[0]["explanation"]
    without_idiot = clf.predict([Example.from_texts("you are a stupid ", ["hello there"])])[0].score
    assert ex["method"] == "occlusion"
    assert ex["utterance"][4]["contribution"] == pytest.approx(records[0]["score"] - without_idiot, abs=1e-6)


def test_cli_prints_a_summary_and_names_bad_files(
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.csv"
    argv = [str(inp), str(out), "--model", str(tiny_model_dir), "--variant", "fp32", "--no-progress"]
    assert score_main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["errors"]) == (8, 4) and out.is_file()
    assert score_main([str(inp), str(tmp_path / "out.txt"), "--no-progress"]) == 2
    assert "out.txt: unknown format '.txt'" in capsys.readouterr().err
    assert score_main([str(tmp_path / "missing.csv"), str(out), "--no-progress"]) == 2
    assert "missing.csv: no such file" in capsys.readouterr().err
    assert score_main([str(inp), str(out), "--model", str(tmp_path / "nomodel"), "--no-progress"]) == 2
    assert "nomodel: no model directory" in capsys.readouterr().err
    assert score_main([str(inp), str(out), "--threshold", "7", "--no-progress"]) == 2  # as SAFETY_THRESHOLD=7 is
    assert "--threshold must be a number in [0, 1], got 7.0" in capsys.readouterr().err
    blocked = tmp_path / "a-file"
    blocked.write_text("x")
    argv = [str(inp), str(blocked / "out.jsonl"), "--model", str(tiny_model_dir), "--variant", "fp32", "--no-progress"]
    assert score_main(argv) == 2  # an output it cannot write: one line, no traceback
    assert "Traceback" not in capsys.readouterr().err


def test_the_command_applies_the_services_item_limits(
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SAFETY_MAX_*`` apply to files as to requests: the command reads them, the engines take them."""
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "utterance": "short"}, {"id": 2, "utterance": "x" * 40}])
    out = tmp_path / "out.jsonl"
    argv = [str(inp), str(out), "--model", str(tiny_model_dir), "--variant", "fp32", "--no-progress", "--restart"]
    assert score_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["errors"] == 0
    monkeypatch.setenv("SAFETY_MAX_UTTERANCE_CHARS", "20")
    assert score_main(argv) == 0
    assert json.loads(capsys.readouterr().out)["errors"] == 1
    assert [r["error"] and r["error"]["code"] for r in read_records(out)] == [None, "utterance_too_long"]


def test_the_command_takes_its_defaults_from_the_serve_settings(
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SAFETY_MODEL_DIR, SAFETY_VARIANT and SAFETY_THRESHOLD apply to files as to `serve` (they were ignored)."""
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "utterance": "have a nice day"}, {"id": 2, "utterance": "ok"}])
    out = tmp_path / "out.jsonl"
    monkeypatch.setenv("SAFETY_MODEL_DIR", str(tiny_model_dir))  # no --model: not the bundled model
    monkeypatch.setenv("SAFETY_VARIANT", "fp32")
    monkeypatch.setenv("SAFETY_THRESHOLD", "0")
    assert score_main([str(inp), str(out), "--no-progress", "--restart"]) == 0
    capsys.readouterr()
    records = read_records(out)
    assert [(r["threshold"], r["label"]) for r in records] == [(0.0, "OFFENSIVE")] * 2
    heads = json.loads((tiny_model_dir / "model_card.json").read_text())["heads"]
    assert all(list(r["categories"]) == heads for r in records)  # the tiny model's heads: not the bundled model
    assert score_main([str(inp), str(out), "--no-progress", "--restart", "--threshold", "1"]) == 0  # flags win
    assert [r["label"] for r in read_records(out)] == ["SAFE", "SAFE"]


def test_a_refused_score_leaves_nothing_behind(
    tmp_path: Path,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parquet asked for without pyarrow: refused before anything is written (it left an empty .parts/)."""
    import sys

    inp = write_jsonl(tmp_path / "in.jsonl", ROWS)
    out = tmp_path / "out.parquet"
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    argv = [str(inp), str(out), "--model", str(tiny_model_dir), "--variant", "fp32", "--no-progress"]
    assert score_main(argv) == 2
    assert "Parquet needs pyarrow" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no out.parquet.parts/, no output
    # and a job refused after its parts directory was made, before its first part: removed too
    job = ScoreJob(inp, tmp_path / "out.jsonl", model_dir=tiny_model_dir, variant="fp32")

    class Refusing:
        model_id = "refusing@1"

        def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]:
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        run_local(job, classifier=Refusing(), progress=False)
    assert not job.parts_dir.exists()


def test_rows_are_read_lazily(tmp_path: Path) -> None:
    """Reading stops where the consumer stops: the reader never holds the file (bounded memory)."""
    from dialogue_safety.corpus.formats import iter_chunks

    inp = write_jsonl(tmp_path / "in.jsonl", [{"utterance": "a"}] * 10, bad_lines=["{broken"])
    chunks = iter_chunks(inp, Columns(), Limits(), chunk_size=4)
    first = next(chunks)
    assert len(first) == 4 and all(r.example is not None for r in first)
    sizes = [len(c) for c in chunks]
    assert sizes == [4, 3]


def test_http_client_is_not_needed_to_score(tmp_path: Path) -> None:
    """The corpus package stays torch-free (it runs on the serve extra)."""
    import subprocess
    import sys

    code = (
        "import sys, dialogue_safety.corpus.job, dialogue_safety.corpus.formats, dialogue_safety.cli.score; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert httpx  # the API comparison above uses a real HTTP client


def test_a_long_row_is_read_in_windows_and_one_past_the_cap_is_an_error(tmp_path: Path, tiny_model_dir: Path) -> None:  # noqa: F811
    long = " ".join(["you are a very stupid idiot and i hate you because you are"] * 30)
    inp = tmp_path / "in.jsonl"
    rows = [{"id": 1, "text": "hello"}, {"id": 2, "text": long}, {"id": 3, "text": long, "history": ["hi"] * 40}]
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    limits = Limits(max_request_history_turns=64)
    run_local(job(tmp_path, inp, "out.jsonl", tiny_model_dir), limits=limits, progress=False)
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[0]["windows"] == 1 and out[0]["truncated"] is None
    assert out[1]["windows"] > 1 and out[1]["truncated"] is None and out[1]["error"] is None
    assert out[2]["truncated"]["history_turns_dropped"] > 0 and out[2]["truncated"]["utterance_chars_unread"] == 0
    capped = Limits(max_windows=2)
    run_local(job(tmp_path, inp, "capped.jsonl", tiny_model_dir), limits=capped, progress=False)
    out = [json.loads(line) for line in (tmp_path / "capped.jsonl").read_text().splitlines()]
    assert out[0]["error"] is None and out[1]["label"] is None
    assert out[1]["error"]["code"] == "too_many_windows" and "SAFETY_MAX_WINDOWS" in out[1]["error"]["message"]
