"""A user's mistake on the command line is one line saying what to fix and exit status 2, found before the work
it would spoil: a data directory that is not one, a report directory with a file in its way, a break-it database
that is not there or is no database."""

from __future__ import annotations

from pathlib import Path

import pytest

from dialogue_safety.cli.main import main as cli_main


def test_export_with_a_data_dir_that_is_not_one_stops_before_exporting(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "model"
    assert cli_main(["export", str(tiny_checkpoint), str(out), "--data-dir", str(tmp_path / "typo"), "-q"]) == 2
    assert "--data-dir" in capsys.readouterr().err and not out.exists()


def test_evaluate_with_a_file_in_the_way_of_its_report_stops_before_evaluating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "report"
    blocked.write_text("not a directory")
    assert cli_main(["evaluate", "models/default", "--out", str(blocked)]) == 2
    assert "a file is in the way" in capsys.readouterr().err


def test_break_it_names_a_database_that_is_missing_or_is_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo" / "game.sqlite3"
    assert cli_main(["break-it", "status", "--db", str(missing)]) == 2
    assert "no break-it database" in capsys.readouterr().err and not missing.parent.exists()  # nothing made
    junk = tmp_path / "rows.jsonl"
    junk.write_text('{"a": 1}\n')
    assert cli_main(["break-it", "status", "--db", str(junk)]) == 2
    assert "cannot open the break-it database" in capsys.readouterr().err
