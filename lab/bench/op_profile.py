"""Where an ONNX engine's time goes, and how far a faster matrix product can take it (``bench runtime``'s
"ops" block).

onnxruntime's own profiler times every kernel of model-only calls on a padded batch of real dialogues
(one row, and one length-sorted batch, at the dialogues' median length), in a session with the engine's file and
options. Kernels are split in two:

* **weight GEMMs**: the matrix products with the model's weights: a matmul-family kernel
  (:data:`WEIGHT_INPUT`) whose weight operand is an initializer in the graph onnxruntime runs (saved next
  to the trace), fp32 or int8, the quantisation of its input included when one kernel does both
  (``DynamicQuantizeMatMul``) and so is a quantisation node read only by such products (a static graph's
  ``QuantizeLinear``);
* **the rest**: attention's products of activations, softmax, LayerNorm, GELU, adds, (de)quantisation,
  gathers, reshapes.

Against a baseline engine (the naive fp32 export, and the naive int8 one), with ``g`` and ``r`` the two
sums per call: the GEMM speed-up ``s = g_base / g``, and the **bound** ``(g_base + r_base) / (g + r_base)``:
the ratio this engine would reach if its other kernels cost no more than the baseline's (Amdahl's law with
the part that quantisation speeds up measured, not assumed). For a ratio target ``T`` against the naive fp32,
the GEMM speed-up it needs on that assumption is ``g_base / ((g_base + r_base) / T - r_base)``, none when the
baseline's other kernels alone exceed the budget. An int8 engine whose measured ``s`` is under the needed one
cannot meet the target with this CPU's integer products, whatever the rest of the graph does.

Kernel sums leave out the time between kernels (the executor's own work), which is why the bench's
model-only latencies are a little higher; the ratios here compare like with like.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: matmul-family kernels (onnxruntime's names after its graph optimisations: fused, quantised and contrib
#: forms) -> the input that holds the weight matrix when the product is with the weights
WEIGHT_INPUT = {
    "MatMul": 1,
    "Gemm": 1,
    "FusedGemm": 1,
    "FusedMatMul": 1,
    "MatMulInteger": 1,
    "MatMulIntegerToFloat": 1,
    "DynamicQuantizeMatMul": 1,
    "QLinearMatMul": 3,
    "QGemm": 3,
    "MatMulNBits": 1,
    "QAttention": 1,
    "Attention": 1,  # onnxruntime's fused attention reads the Q/K/V weights: counted whole
}
INPUT_QUANTISERS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear"})  # activations quantised for a product
PROFILE_RUNS = {"single": 100, "batch": 8}  # profiled calls per shape (after WARMUP_RUNS untimed ones)
SMOKE_RUNS = {"single": 2, "batch": 1}
WARMUP_RUNS = 2
ROUNDS = 4  # turns of every engine per shape


def weight_nodes(graph_path: Path) -> frozenset[str]:
    """Names of the nodes of an ONNX graph (the one onnxruntime runs, saved by it) that multiply by a weight
    matrix: a :data:`WEIGHT_INPUT` op whose weight operand is an initializer or a Constant's output, and the
    quantisation of their input (:data:`INPUT_QUANTISERS` read only by such products): a naive
    ``DynamicQuantizeMatMul`` quantises inside the product, a static graph in a node before it, and both
    belong to what int8 weights cost."""
    import onnx

    graph = onnx.load(str(graph_path), load_external_data=False).graph
    constants = {t.name for t in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    products = {
        n.name
        for n in graph.node
        if n.op_type in WEIGHT_INPUT
        and len(n.input) > WEIGHT_INPUT[n.op_type]
        and n.input[WEIGHT_INPUT[n.op_type]] in constants
    }
    readers: dict[str, set[str]] = defaultdict(set)
    for n in graph.node:
        for name in n.input:
            readers[name].add(n.name)
    quantisers = {
        n.name
        for n in graph.node
        if n.op_type in INPUT_QUANTISERS and (read := set().union(*(readers[o] for o in n.output))) and read <= products
    }
    return frozenset(products | quantisers)


def kernel_split(events: Iterable[Mapping[str, Any]], runs: int, weights: frozenset[str]) -> dict[str, Any]:
    """Per-call milliseconds of onnxruntime profile ``events`` (its JSON trace) over ``runs`` calls:
    weight GEMMs (the kernels of the nodes named in ``weights``), the rest, and the rest by op type
    (largest first)."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    gemm = 0.0
    rest: dict[str, float] = defaultdict(float)
    gemm_ops: dict[str, float] = defaultdict(float)
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        op = str((e.get("args") or {}).get("op_name", "?"))
        us = float(e.get("dur", 0))
        if name.removesuffix("_kernel_time") in weights:
            gemm += us
            gemm_ops[op] += us
        else:
            rest[op] += us
    per_call = 1000.0 * runs  # µs summed over runs -> ms per call
    rest_ms = sum(rest.values()) / per_call
    gemm_ms = gemm / per_call
    return {
        "kernels_ms": round(gemm_ms + rest_ms, 3),
        "gemm_ms": round(gemm_ms, 3),
        "rest_ms": round(rest_ms, 3),
        "gemm_share": round(gemm_ms / (gemm_ms + rest_ms), 3) if gemm_ms + rest_ms > 0 else None,
        "gemm_ops": sorted(gemm_ops, key=gemm_ops.__getitem__, reverse=True),
        "rest_by_op_ms": {
            op: round(us / per_call, 3) for op, us in sorted(rest.items(), key=lambda kv: kv[1], reverse=True)
        },
    }


def profile_sessions(
    models: Mapping[str, tuple[Path, Any]], feeds: Mapping[str, np.ndarray], runs: int, rounds: int
) -> dict[str, dict[str, Any]]:
    """:func:`kernel_split` per engine of ``runs`` calls on ``feeds``: one profiling session per engine
    (``models``: name -> (ONNX file, a factory of its session options)), the calls taken in ``rounds`` turns
    of every engine (a machine that speeds up or slows down moves them all alike), the traces written to a
    temporary folder and removed. Each split also holds the profiled wall time per call (median)."""
    import onnxruntime as ort

    folder = Path(tempfile.mkdtemp(prefix="bench-ops-"))
    try:
        sessions: dict[str, tuple[Any, dict[str, np.ndarray]]] = {}
        weights: dict[str, frozenset[str]] = {}
        for name, (path, make_options) in models.items():
            options = make_options()
            options.enable_profiling = True
            options.log_severity_level = 3  # not the warning that a saved optimised graph is machine-specific
            options.profile_file_prefix = str(folder / f"profile-{len(sessions)}")
            options.optimized_model_filepath = str(folder / f"graph-{len(sessions)}.onnx")
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            weights[name] = weight_nodes(Path(options.optimized_model_filepath))
            names = {i.name for i in session.get_inputs()}
            sessions[name] = session, {k: v for k, v in feeds.items() if k in names}
            for _ in range(WARMUP_RUNS):
                session.run(None, sessions[name][1])
        rounds = max(1, min(rounds, runs))
        for r in range(rounds):
            for session, inputs in sessions.values():
                for _ in range(runs // rounds + (1 if r < runs % rounds else 0)):
                    session.run(None, inputs)
        traces = {
            name: json.loads(Path(session.end_profiling()).read_text()) for name, (session, _) in sessions.items()
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {name: _timed_split(events, runs, weights[name]) for name, events in traces.items()}


def _timed_split(events: list[dict[str, Any]], runs: int, weights: frozenset[str]) -> dict[str, Any]:
    """:func:`kernel_split` of the last ``runs`` calls of a trace (the warm-up calls left out)."""
    calls = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"), key=lambda e: e["ts"]
    )
    if len(calls) < runs:
        raise RuntimeError(f"onnxruntime's profile holds {len(calls)} calls, expected at least {runs}")
    timed = calls[-runs:]
    start = timed[0]["ts"]
    split = kernel_split([e for e in events if e.get("ts", -1) >= start], runs, weights)
    split["profiled_call_ms"] = round(statistics.median(float(e["dur"]) / 1000.0 for e in timed), 3)
    return split


def against(engine: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """One engine's kernel split against a baseline's (same shape): kernel-time ratio, GEMM speed-up and
    the bound with the baseline's other kernels (module docstring)."""
    g, r = engine["gemm_ms"], engine["rest_ms"]
    g0, r0 = base["gemm_ms"], base["rest_ms"]
    return {
        "kernels_x": round((g0 + r0) / (g + r), 2) if g + r > 0 else None,
        "gemm_speedup": round(g0 / g, 2) if g > 0 else None,
        "rest_x": round(r / r0, 2) if r0 > 0 else None,  # this engine's other kernels, x the baseline's
        "bound_x": round((g0 + r0) / (g + r0), 2) if g + r0 > 0 else None,
    }


def needed_gemm_speedup(base: Mapping[str, Any], target_x: float) -> float | None:
    """The GEMM speed-up over ``base`` that a ``target_x`` ratio needs if every other kernel costs what the
    baseline's do (None: those kernels alone are over the budget, no GEMM speed-up is enough)."""
    g0, r0 = base["gemm_ms"], base["rest_ms"]
    budget = (g0 + r0) / target_x
    if budget <= r0:
        return None
    return round(g0 / (budget - r0), 2)


def engine_ops(
    models: Mapping[str, tuple[Path, Any]],
    feeds: Mapping[str, Mapping[str, np.ndarray]],
    smoke: bool,
    baselines: Sequence[str],
    targets: Mapping[str, tuple[str, str, float]],
) -> dict[str, Any]:
    """The ops block of the runtime report. ``models``: engine name -> (ONNX file, a factory of its session
    options); ``feeds``: shape name (``single``, ``batch``) -> inputs; ``baselines``: the engines every other
    is compared with (when profiled); ``targets``: name -> (baseline engine, shape, ratio) of the ratio targets
    to translate into needed GEMM speed-ups. Returns ``{"shapes": {shape: {"rows", "tokens"}}, "runs",
    "engines": {name: {shape: split}}, "vs": {baseline: {name: {shape: against}}}, "needed_gemm_speedup":
    {target: {"baseline", "shape", "ratio", "value"}}}``."""
    runs = SMOKE_RUNS if smoke else PROFILE_RUNS
    out: dict[str, Any] = {
        "shapes": {
            s: {"rows": int(f["input_ids"].shape[0]), "tokens": int(f["input_ids"].shape[1])} for s, f in feeds.items()
        },
        "runs": dict(runs),
        "engines": {name: {} for name in models},
        "vs": {},
    }
    for shape, f in feeds.items():
        for name, split in profile_sessions(models, f, runs[shape], ROUNDS).items():
            out["engines"][name][shape] = split
    for base_name in baselines:
        base = out["engines"].get(base_name)
        if base is None:
            continue
        out["vs"][base_name] = {
            name: {shape: against(split, base[shape]) for shape, split in e.items()}
            for name, e in out["engines"].items()
            if name != base_name
        }
    out["needed_gemm_speedup"] = {
        key: {
            "baseline": base,
            "shape": shape,
            "ratio": ratio,
            "value": needed_gemm_speedup(out["engines"][base][shape], ratio),
        }
        for key, (base, shape, ratio) in targets.items()
        if base in out["engines"] and shape in out["engines"][base]
    }
    return out


def ops_markdown(ops: Mapping[str, Any]) -> list[str]:
    """The ops block as markdown lines: per engine and shape the kernel split and, against the naive fp32,
    the GEMM speed-up and its bound; then the GEMM speed-up each ratio target needs."""
    shapes = ops["shapes"]
    vs = ops.get("vs", {}).get("naive-fp32", {})
    lines = [
        "Where the time goes (onnxruntime's profiler, model only, kernel ms per call; "
        + ", ".join(f"{s}: {v['rows']} x {v['tokens']} tokens" for s, v in shapes.items())
        + "). Bound: the ratio to the naive fp32 with this engine's weight GEMMs and the naive fp32's other kernels.",
        "",
        "| engine | shape | kernels ms | weight GEMMs ms | rest ms | GEMM share | x naive fp32 | GEMM speed-up "
        "| bound x | largest other kernels |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, by_shape in ops["engines"].items():
        for shape, sp in by_shape.items():
            a = vs.get(name, {}).get(shape, {})
            top = ", ".join(f"{op} {ms}" for op, ms in list(sp["rest_by_op_ms"].items())[:3])
            lines.append(
                f"| {name} | {shape} | {sp['kernels_ms']} | {sp['gemm_ms']} | {sp['rest_ms']} | {sp['gemm_share']} "
                f"| {a.get('kernels_x', '—')} | {a.get('gemm_speedup', '—')} | {a.get('bound_x', '—')} | {top} |"
            )
    default = ops.get("cpu_default")
    for key, need in ops.get("needed_gemm_speedup", {}).items():
        value = need["value"]
        measured = ops["vs"].get(need["baseline"], {}).get(default, {}).get(need["shape"], {}).get("gemm_speedup")
        lines.append(
            f"- {key} ({need['ratio']:g}x {need['baseline']}, {need['shape']}): needs weight GEMMs "
            + (
                "faster than any speed-up can make them (its other kernels alone exceed the budget)"
                if value is None
                else f"{value}x the baseline's"
            )
            + " with the baseline's other kernels"
            + (f"; the CPU default's ({default}): {measured}x" if measured is not None else "")
        )
    return lines
