"""``dialogue-safety bench runtime --smoke`` runs end to end (no timing asserts: benchmarks are programs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dialogue_safety.benchmarks.flops import cpu_peak, flops_per_token, non_embedding_parameters
from dialogue_safety.cli.bench import main as bench_main
from dialogue_safety.training.modeling import GEOMETRIES


def test_smoke_run_writes_json_and_markdown(
    tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    rc = bench_main(["runtime", "--smoke", "--checkpoint", str(tiny_checkpoint), "--json", str(out), "-q"])
    assert rc == 0
    report = json.loads(out.read_text())
    engines = {e["engine"]: e for e in report["engines"]}
    assert {"torch eager", "onnxruntime fp32", "onnxruntime optimized", "onnxruntime int8"} <= set(engines)
    assert "onnxruntime int8 unchecked" in engines  # what the fp32 check near the threshold costs
    assert {"naive-fp32", "naive-int8"} <= set(engines)  # torch.onnx.export + quantize_dynamic, same checkpoint
    assert engines["naive-int8"]["file_mb"] < engines["naive-fp32"]["file_mb"]
    plan = report["plan"]  # measured in turns: every engine got every round and the same single dialogues
    assert "rounds" in report["interleaved"]
    for e in engines.values():
        assert e["single"]["n"] == plan["singles"]
        assert len(e["sorted64"]["seconds"]) == len(e["token_budget"]["seconds"]) == plan["repeats"]
    ratios = report["ratios"]
    assert set(ratios) == {"vs_naive-fp32", "vs_naive-int8"} and set(ratios["vs_naive-fp32"]) == set(engines)
    assert ratios["vs_naive-fp32"]["naive-fp32"] == {
        "sorted64_x": 1.0,
        "token_budget_x": 1.0,
        "single_p50_fraction": 1.0,
    }
    assert "torch.onnx.export" in report["naive_exporter"]
    for e in engines.values():
        assert e["single"]["p50_ms"] > 0 and e["sorted64"]["examples_per_s"] > 0
        assert e["token_budget"]["max_batch_size"] == 256
        long = {r["chars"]: r for r in e["long_messages"]}  # the long-message rows, every window read
        assert set(long) == {500, 1000} and long[1000]["windows"] > long[500]["windows"] >= 1
        assert long[500]["x_first"] == 1.0 and all(r["ms_per_window"] > 0 for r in long.values())
    assert {(c["batch"], c["seq_len"]) for c in report["sweep"]} >= {(1, 16), (4, 16)}
    assert report["dialogues"]["n"] > 0 and report["targets"] == {"note": "smoke run: no targets apply"}
    assert report["machine"]["flop_per_cycle_avx2_fma"] == 32
    printed = capsys.readouterr().out
    assert "| engine | characters | windows |" in printed
    assert "Ratios against naive-fp32" in printed
    assert "| engine |" in printed and json.loads(printed[: printed.index("\n\n###")])["benchmark"] == "runtime"


def test_bench_cli_usage_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main([]) == 0 and "runtime" in capsys.readouterr().out
    assert bench_main(["nope"]) == 2
    assert bench_main(["runtime", "--model", str(tmp_path / "absent")]) == 2
    assert bench_main(["runtime", "--geometry", "huge"]) == 2


def test_flops_per_token_matches_the_formula() -> None:
    g = GEOMETRIES["minilm-l6"]
    geometry = {"hidden_size": g.hidden_size, "num_hidden_layers": 6, "intermediate_size": 1536, "num_labels": 1}
    params = non_embedding_parameters(geometry)
    assert 10.6e6 < params < 11.0e6  # MiniLM-L6: 22.7 M parameters, 11.9 M of them embeddings
    assert flops_per_token(geometry, 49) == pytest.approx(2 * params + 4 * 6 * 384 * 49)
    peak = cpu_peak(2)
    assert peak["cores"] == 2 and peak["flop_per_cycle_avx2_fma"] == 32
