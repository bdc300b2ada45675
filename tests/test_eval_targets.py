"""The targets table: read from an evaluation's results, the model beside the previous one, and the copy in
docs/model.md kept equal to the committed report by scripts/docs_examples.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_docs_examples import docs_examples

from dialogue_safety.evaluation import targets
from dialogue_safety.evaluation.report import render_report, targets_table


def _metrics(n: int, positives: int, recall: float, precision: float, f1: float) -> dict[str, Any]:
    return {
        "n": n,
        "positives": positives,
        "recall": recall,
        "precision": precision,
        "offensive_f1": f1,
        "accuracy": 50.0,
    }


def _results() -> dict[str, Any]:
    requests = {
        # 40 harmful of 100: 30 caught (recall 75 %), 10 look-alikes flagged (precision 30 / 40 = 75 %)
        "model": _metrics(100, 40, 75.0, 75.0, 75.0),
        "previous": _metrics(100, 40, 50.0, 50.0, 50.0),
    }
    return {
        "model": {"name": "m@2"},
        "previous": {"name": "m@1"},
        "config": {"suites": ["rounds", "history"]},
        "rounds": {
            "rows": [
                {"source": "olid", "task": "olid", "round": "-", "split": "valid", "metrics": {"model": {}}},
                {
                    "source": "olid",
                    "task": "olid",
                    "round": "-",
                    "split": "test",
                    "metrics": {
                        "model": _metrics(10, 5, 80.0, 80.0, 76.0),
                        "previous": _metrics(10, 5, 70.0, 70.0, 70.0),
                    },
                },
                {"source": "requests", "task": "requests", "round": "-", "split": "test", "metrics": requests},
                {
                    "source": "hatemoji",
                    "task": "hatemoji",
                    "round": "R5",
                    "split": "test",
                    "metrics": {"model": _metrics(1, 1, 1, 1, 1.0), "previous": _metrics(1, 1, 1, 1, 1.0)},
                },
                {
                    "source": "hatemoji",
                    "task": "hatemoji",
                    "round": "all",
                    "split": "test",
                    "metrics": {"model": _metrics(9, 5, 1, 1, 70.0), "previous": _metrics(9, 5, 1, 1, 72.0)},
                },
            ]
        },
        "history": {
            "scorers": {
                "model": {"hostile_history": {"rise": 4.0}},
                "previous": {"hostile_history": {"rise": 12.0}},
            }
        },
    }


def _row(rows: list[list[str]], start: str) -> list[str]:
    (row,) = [r for r in rows if r[0].startswith(start)]
    return row


def test_each_target_reads_its_test_row_and_says_whether_it_is_met() -> None:
    rows = targets.target_rows(_results())
    assert _row(rows, "OLID") == ["OLID: F1", "≥ 75", "76.0", "70.0", "yes"]
    # all rounds, not the first round's row
    assert _row(rows, "HatemojiBuild") == ["HatemojiBuild: F1", "≥ previous model", "70.0", "72.0", "**no**"]
    assert _row(rows, "Hostile")[2:] == ["4.0", "12.0", "yes"]
    assert _row(rows, "Requests")[2:] == ["75.0", "50.0", "yes"]
    # the look-alikes' false alarms from recall and precision: 10 of 60, then 20 of 60
    assert _row(rows, "Their safe look-alikes")[2:] == ["16.7", "33.3", "**no**"]
    # what the results cannot answer is left out, not shown empty
    assert not [r for r in rows if r[0].startswith(("DiaSafety", "Context flips"))]


def test_without_a_previous_model_a_relative_target_is_undecided() -> None:
    results = _results()
    del results["previous"]
    assert _row(targets.target_rows(results), "HatemojiBuild")[3:] == ["—", "—"]
    assert _row(targets.target_rows(results), "OLID")[3:] == ["—", "yes"]


def test_the_report_opens_with_the_targets() -> None:
    page = render_report({**_results(), "config": {"suites": []}}, {})
    assert page.index("# Robustness report") < page.index("## Targets") < page.index("Regenerate")
    assert targets_table(_results()) in page


def test_the_readme_copy_is_rewritten_from_the_report_and_checked(tmp_path: Path) -> None:
    report = tmp_path / "results.json"
    report.write_text(json.dumps(_results()), encoding="utf-8")
    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- targets -->\n| stale |\n<!-- /targets -->\nend\n", encoding="utf-8")
    findings = docs_examples.process_targets([doc], report, write=False)
    assert [f.problem for f in findings] == [f"targets table differs from {report}"]
    assert docs_examples.process_targets([doc], report, write=True) == []
    assert docs_examples.process_targets([doc], report, write=False) == []
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("intro\n<!-- targets -->\n| measure") and text.endswith("\n<!-- /targets -->\nend\n")
    assert "| OLID: F1 | ≥ 75 | 76.0 | 70.0 | yes |" in text


def test_the_model_doc_quotes_the_committed_report() -> None:
    doc = docs_examples.REPO / "docs" / "model.md"
    assert docs_examples.TARGETS_BLOCK.search(doc.read_text(encoding="utf-8")), "docs/model.md has no targets table"
    assert docs_examples.process_targets([doc], write=False) == []
