"""The HTTP benchmark runs end to end (--smoke, tiny model, synthetic data): it starts the real
server through the CLI, the overload server and the naive baseline. No timing assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from lab.bench import http as bench_http
from lab.bench import local_server


def test_http_benchmark_smoke(
    tiny_model_dir: Path,  # noqa: F811
    tiny_checkpoint: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "http.json"
    rc = bench_http.main(
        [
            "--model",
            str(tiny_model_dir),
            "--smoke",
            "--data-dir",
            str(tmp_path),
            "--json",
            str(out),
            "--naive-checkpoint",
            str(tiny_checkpoint),
        ],
        prog="python -m lab.bench http",
    )
    assert rc == 0
    report = json.loads(out.read_text())
    captured = capsys.readouterr()
    printed = captured.out
    assert "[bench http] round 2/2: runtime, c=1,4" in captured.err  # progress on stderr, the report on stdout
    assert "| phase | round | concurrency |" in printed and "SYNTHETIC" in report["data"]
    classify = [p for p in report["service"] if p["name"] == "classify"]
    # --smoke measures in two rounds: runtime, then the classify phases, in turns
    assert [(p["round_no"], p["concurrency"]) for p in classify] == [(1, 1), (1, 4), (2, 1), (2, 4)]
    assert [r["round_no"] for r in report["runtime_rounds"]] == [1, 2]
    over = [p["p50_ms"] - r["single_p50_ms"] for p, r in zip(classify[::2], report["runtime_rounds"], strict=True)]
    c1 = report["targets"]["c1_p50_over_runtime_ms"]
    assert c1["rounds"] == [round(v, 3) for v in over]
    assert c1["value"] == pytest.approx(sum(over) / 2, abs=1e-3)  # the median of two rounds
    assert c1["met"] == (c1["value"] <= 1.0)
    floor = [p for p in report["service"] if p["name"] == "health"]  # GET /health at c=1 in each round
    assert [(p["round_no"], p["concurrency"]) for p in floor] == [(1, 1), (2, 1)]
    less = report["targets"]["c1_p50_over_runtime_less_floor_ms"]["rounds"]
    assert less == [round(o - p["p50_ms"], 3) for o, p in zip(over, floor, strict=True)]
    assert report["targets"]["c1_http_floor_ms"]["rounds"] == [p["p50_ms"] for p in floor]
    assert "met" not in report["targets"]["c1_http_floor_ms"]  # informative: the issue sets no limit on it
    assert "| GET /health p50 ms |" in printed
    gap = report["targets"]["runtime_single_after_gap_over_back_to_back_ms"]["rounds"]  # the model after a pause
    assert gap == [round(r["single_after_gap_p50_ms"] - r["single_p50_ms"], 3) for r in report["runtime_rounds"]]
    assert report["runtime"]["language_check"] is True  # the service's default: the same work on both sides
    assert report["runtime"]["single_p50_ms"] == pytest.approx(
        sum(r["single_p50_ms"] for r in report["runtime_rounds"]) / 2, abs=1e-3
    )
    for phase in report["service"]:
        assert phase["ok"] > 0 and phase["errors"] == 0, phase
        assert phase["p50_ms"] is not None
    assert report["runtime"]["single_p50_ms"] > 0
    overload = report["overload"]
    assert overload["recovered"] and overload["phase"]["requests"] > 0
    assert set(overload["phase"]["status_counts"]) <= {"200", "429"}
    assert report["naive"]["ok"] > 0 and report["naive"]["errors"] == 0
    assert "c4_vs_naive" in report["targets"]
    ceiling = report["targets"]["runtime_batched_vs_naive"]["value"]
    assert ceiling == pytest.approx(
        report["runtime"]["batched_items_per_s"] / report["naive"]["throughput_rps"], rel=0.01
    )
    assert "| runtime_batched_vs_naive |" in printed


def test_server_settings_are_checked_against_the_service_settings() -> None:
    assert local_server.server_settings(["allow_spinning=false", "SAFETY_MAX_BATCH_SIZE=32"]) == {
        "allow_spinning": "false",
        "max_batch_size": "32",
    }
    env = local_server.service_env(**local_server.server_settings(["max_batch_size=32"]))
    assert env["SAFETY_MAX_BATCH_SIZE"] == "32"
    for bad in ("max_batch_size", "no_such_setting=1"):
        with pytest.raises(SystemExit, match="--server-setting"):
            local_server.server_settings([bad])
