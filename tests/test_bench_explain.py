"""``python -m lab.bench explain`` runs end to end on the tiny model (no timing asserts: benchmarks are programs)."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from lab.bench.cli import main as bench_main


def test_bench_explain_writes_json_and_markdown(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["explain", "--model", str(tiny_model_dir), "--variant", "fp32", "--words", "5,40", "--repeats", "2"]
    assert bench_main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = {(r["words"], r["method"]): r for r in report["rows"]}
    assert set(rows) == {(5, "shapley"), (5, "occlusion"), (40, "shapley"), (40, "occlusion")}
    assert all(r["p50_ms"] > 0 and r["p90_ms"] >= r["p50_ms"] for r in rows.values())
    assert rows[(5, "shapley")]["sequences"] == 2**5 and rows[(5, "occlusion")]["sequences"] == 6  # exact; n + 1
    assert rows[(40, "shapley")]["sequences"] == 2 + 40 + report["shapley_budget"]
    # the Shapley plan scores fewer padded tokens than leave-one-out at 40 words
    assert rows[(40, "shapley")]["padded_tokens"] < rows[(40, "occlusion")]["padded_tokens"]
    assert "| 40 | shapley |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        bench_main(["explain", "--model", str(tiny_model_dir), "--words", "x"])
    assert bad.value.code == 2
