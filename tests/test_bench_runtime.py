"""``python -m lab.bench runtime --smoke`` runs end to end (no timing asserts: benchmarks are programs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.training.modeling import GEOMETRIES
from lab.bench.cli import main as bench_main
from lab.bench.flops import cpu_peak, flops_per_token, non_embedding_parameters
from lab.bench.op_profile import against, kernel_split, needed_gemm_speedup, weight_nodes


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
    ops = report["ops"]  # where the time goes: every CPU onnxruntime file profiled once (unchecked = int8's)
    assert set(ops["engines"]) == {"naive-fp32", "naive-int8", "fp32", "optimized", "int8"}
    assert ops["shapes"]["single"]["rows"] == 1 and ops["shapes"]["batch"]["rows"] > 1
    for by_shape in ops["engines"].values():
        for split in by_shape.values():
            assert split["gemm_ms"] > 0 and split["rest_ms"] > 0  # every model multiplies by weights
            assert split["kernels_ms"] == pytest.approx(split["gemm_ms"] + split["rest_ms"], abs=0.002)
    assert set(ops["vs"]["naive-fp32"]) == {"naive-int8", "fp32", "optimized", "int8"}
    assert "DynamicQuantizeMatMul" in ops["engines"]["naive-int8"]["batch"]["gemm_ops"]  # the naive int8's products
    assert set(ops["needed_gemm_speedup"]) == {
        "batched_vs_naive_fp32",
        "single_p50_vs_naive_fp32",
        "int8_batched_vs_naive_int8",
    }
    printed = capsys.readouterr().out
    assert "Where the time goes" in printed
    assert ops["cpu_default"] == report["cpu_variant"] and f"the CPU default's ({report['cpu_variant']})" in printed
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


def test_kernel_split_sums_the_profiled_kernels_per_call() -> None:
    def kernel(node: str, op: str, us: float) -> dict[str, object]:
        return {"cat": "Node", "name": f"{node}_kernel_time", "dur": us, "args": {"op_name": op}}

    events = [
        kernel("q", "MatMulIntegerToFloat", 300),
        kernel("scores", "MatMul", 100),  # a product of activations: not a weight GEMM
        kernel("ln", "LayerNormalization", 60),
        kernel("q", "MatMulIntegerToFloat", 500),
        kernel("ln", "LayerNormalization", 40),
        {"cat": "Node", "name": "q_fence_before", "dur": 999, "args": {"op_name": "MatMulIntegerToFloat"}},
        {"cat": "Session", "name": "model_run", "dur": 2000},
    ]
    split = kernel_split(events, runs=2, weights=frozenset({"q"}))
    assert split["gemm_ms"] == 0.4 and split["rest_ms"] == 0.1  # (300 + 500) / 2 µs; (100 + 60 + 40) / 2
    assert split["kernels_ms"] == 0.5 and split["gemm_share"] == 0.8
    assert split["rest_by_op_ms"] == {"MatMul": 0.05, "LayerNormalization": 0.05}
    assert split["gemm_ops"] == ["MatMulIntegerToFloat"]
    with pytest.raises(ValueError):
        kernel_split(events, runs=0, weights=frozenset())


def test_bound_and_needed_gemm_speedup_by_hand() -> None:
    base = {"gemm_ms": 80.0, "rest_ms": 20.0}  # the naive fp32: 100 ms, 80 % in weight GEMMs
    int8 = {"gemm_ms": 40.0, "rest_ms": 30.0}
    got = against(int8, base)
    assert got == {"kernels_x": 1.43, "gemm_speedup": 2.0, "rest_x": 1.5, "bound_x": 1.67}  # 100/70, 100/(40+20)
    assert needed_gemm_speedup(base, 2.0) == 2.67  # budget 50 ms - 20 of the rest: 80 / 30
    assert needed_gemm_speedup(base, 5.0) is None  # budget 20 ms: the rest alone fills it
    assert needed_gemm_speedup(base, 1.0) == 1.0


def test_weight_nodes_are_products_with_initializers(tmp_path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="dense"),
        helper.make_node("MatMul", ["a", "x"], ["b"], name="scores"),  # activations only
        helper.make_node(
            "Constant", [], ["c"], name="const", value=numpy_helper.from_array(np.ones((4, 4), np.float32))
        ),
        helper.make_node("MatMul", ["b", "c"], ["d"], name="from_constant"),
        helper.make_node("Add", ["d", "w"], ["y"], name="bias_like"),  # reads a weight, not a product
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])],
        [w],
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert weight_nodes(path) == {"dense", "from_constant"}


def test_the_quantisation_of_a_products_input_counts_with_the_product(tmp_path: Path) -> None:
    """A naive DynamicQuantizeMatMul quantises inside the product; a static graph's QuantizeLinear before it
    must land on the same side of the split (one read by anything else stays in the rest)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.ones((4, 4), dtype=np.int8), "w"),
        numpy_helper.from_array(np.array(0.1, dtype=np.float32), "s"),
        numpy_helper.from_array(np.array(0, dtype=np.uint8), "z"),
        numpy_helper.from_array(np.array(0.1, dtype=np.float32), "ws"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_for_dense"),
        helper.make_node("MatMulInteger", ["xq", "w", "z"], ["a"], name="dense"),
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq2"], name="q_shared"),
        helper.make_node("MatMulInteger", ["xq2", "w", "z"], ["b"], name="dense2"),
        helper.make_node("Cast", ["xq2"], ["c"], name="other_reader", to=TensorProto.INT32),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info(n, TensorProto.INT32, [4, 4]) for n in ("a", "b", "c")],
        inits,
    )
    path = tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert weight_nodes(path) == {"q_for_dense", "dense", "dense2"}


def test_vs_times_another_models_served_default_in_the_same_rounds(
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dialogue_safety.core.model_card import ModelCard

    served_variant = ModelCard.load(tiny_model_dir).cpu_variant
    out = tmp_path / "vs.json"
    argv = ["runtime", "--smoke", "--model", str(tiny_model_dir), "--vs", str(tiny_model_dir)]
    argv += ["--variants", served_variant]
    assert bench_main([*argv, "--no-sweep", "--no-long", "--no-ops", "--json", str(out), "-q"]) == 0
    report = json.loads(out.read_text())
    engines = {e["variant"]: e for e in report["engines"]}
    assert set(engines) == {served_variant, "vs " + served_variant}
    assert report["vs"]["model_dir"] == str(tiny_model_dir)
    vs = report["ratios"]["served_vs_model"]
    served, other = engines[report["cpu_variant"]], engines["vs " + report["vs"]["cpu_variant"]]
    assert vs["single_p50_x"] == round(served["single"]["p50_ms"] / other["single"]["p50_ms"], 2)
    assert other["single"]["n"] == served["single"]["n"]  # the same dialogues, in the same rounds
    assert "served default against" in capsys.readouterr().out
