"""``python -m lab.bench score`` runs end to end on the tiny model (no timing asserts: benchmarks are programs)."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from lab.bench.cli import main as bench_main


def test_bench_score_writes_json_and_markdown(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["score", "--model", str(tiny_model_dir), "--variant", "fp32", "--rows", "40", "--chunk-size", "16"]
    argv += [
        "--repeats",
        "1",
        "--explain-rows",
        "5",
        "--explain-singles",
        "3",
        "--rss-rows",
        "50,100",
        "--no-ray",
        "--json",
        str(out),
        "-q",
    ]
    assert bench_main(argv) == 0
    report = json.loads(out.read_text())
    keys = [e["key"] for e in report["engines"]]
    assert keys == ["runtime", "local", "explain"]
    assert all(e["rows_per_s"] > 0 for e in report["engines"])
    assert report["explain_latency"]["requests"] == 3 and report["explain_latency"]["explain_p50_ms"] > 0
    assert [r["rows"] for r in report["peak_rss"]] == [50, 100] and report["peak_rss"][0]["peak_rss_mib"] > 0
    assert set(report["targets"]) == {"local_vs_runtime", "peak_rss_independent_of_size"}
    assert "| engine | rows/s |" in capsys.readouterr().out
    assert bench_main(["score", "--rows", "0"]) == 2
