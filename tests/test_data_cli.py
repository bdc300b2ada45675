"""``dialogue-safety data summary``: table, JSON, warnings, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dialogue_safety.cli.main import main as dialogue_safety
from dialogue_safety.sources import summary
from dialogue_safety.sources.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "sources"


def run_json(capsys: pytest.CaptureFixture[str], data_dir: Path) -> tuple[int, dict, str]:
    code = main(["summary", "--data-dir", str(data_dir), "--json"], prog="dialogue-safety data")
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def rows_by_key(payload: dict) -> dict[tuple[str, str, str, str | None], dict]:
    return {(r["source"], r["task"], r["split"], r["round"]): r for r in payload["rows"]}


def test_table_lists_every_source_split_and_round(capsys: pytest.CaptureFixture[str]) -> None:
    assert dialogue_safety(["data", "summary", "--data-dir", str(FIXTURES / "full")]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == f"data dir: {FIXTURES / 'full'}"
    header = next(line for line in lines if line.startswith("source "))
    assert header.split() == ["source", "status", "task", "split", "round", "examples", "offensive", "tokens"]
    hatemoji_train = [line.split() for line in lines if line.startswith("hatemoji ") and " train " in line]
    assert [row[4:7] for row in hatemoji_train] == [["R5", "2", "50.0%"], ["R6", "2", "50.0%"]]
    assert "sources (no dataset is redistributed with this project):" in lines


def test_json_counts_rates_and_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    code, payload, _ = run_json(capsys, FIXTURES / "full")
    assert code == 0 and payload["errors"] == []
    rows = rows_by_key(payload)
    diasafety = rows[("diasafety", "diasafety", "train", None)]
    assert (diasafety["count"], diasafety["offensive"], diasafety["offensive_rate"]) == (4, 2, 0.5)
    assert rows[("bbf_single_turn", "bbf_single_turn/standard", "train", "2")]["count"] == 2
    assert rows[("wtc", "wtc/kaggle_test", "test", None)]["count"] == 3
    # [CLS] [SEP] utterance [SEP] at least; the BAD rows carry history so they are longer
    assert all(r["mean_tokens"] >= 3 for r in payload["rows"])
    assert {s["name"]: s["status"] for s in payload["sources"]}["convabuse"] == "complete"


def test_sample_only_sources_are_flagged(capsys: pytest.CaptureFixture[str]) -> None:
    code, payload, err = run_json(capsys, FIXTURES / "samples")
    assert code == 0
    statuses = {s["name"]: s["status"] for s in payload["sources"]}
    assert statuses["wtc"] == statuses["bad"] == statuses["bbf_single_turn"] == "sample-only"
    assert statuses["hatecheck"] == "missing" and statuses["dynahate"] == "partial"
    for name in ("bbf_single_turn", "bbf_multi_turn", "wtc", "bad"):
        assert f"warning: {name} is sample-only here" in err
    assert not any(r["source"] == "bad" for r in payload["rows"])  # YAML fixtures are not loaded
    assert rows_by_key(payload)[("dynahate", "dynahate", "test", "1")]["count"] == 2


def test_whitespace_tokens_without_the_minilm_package(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(summary, "MINILM_PACKAGE", "no_such_package_for_tests")
    code, payload, err = run_json(capsys, FIXTURES / "full")
    assert code == 0 and "whitespace tokens" in payload["tokens"] and "note: tokens are whitespace" in err
    assert rows_by_key(payload)[("hatecheck", "hatecheck", "test", None)]["mean_tokens"] == pytest.approx(27 / 5)


def test_missing_data_dir_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["summary", "--data-dir", str(tmp_path / "nope")], prog="x") == 2
    assert capsys.readouterr().err == f"error: data directory {tmp_path / 'nope'} does not exist\n"


def test_malformed_file_is_reported_and_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "diasafety").mkdir()
    (tmp_path / "diasafety" / "test.json").write_text("[\n{oops}\n]", encoding="utf-8")
    assert main(["summary", "--data-dir", str(tmp_path)], prog="x") == 1
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'diasafety' / 'test.json'}:2: invalid JSON" in err


def test_help_and_unknown_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"], prog="dialogue-safety data")
    assert exit_info.value.code == 0 and "summary" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["explode"], prog="dialogue-safety data")
    assert exit_info.value.code == 2


@pytest.mark.data
def test_summary_of_the_real_data_dir(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, data_dir: Path
) -> None:
    monkeypatch.setattr(summary, "MINILM_PACKAGE", "no_such_package_for_tests")  # counts only: keep it fast
    code, payload, err = run_json(capsys, data_dir)
    assert code == 0
    rows = rows_by_key(payload)
    assert rows[("hatecheck", "hatecheck", "test", None)]["count"] == 3728
    assert sum(r["count"] for r in payload["rows"] if r["source"] == "diasafety") == 11209
    assert "warning: bbf_single_turn is sample-only here" in err
