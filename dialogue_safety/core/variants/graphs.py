"""The graph transforms that derive ONNX variants (onnx + onnxruntime tools, torch-free): fp16 weight
storage and its exact fold back to fp32, the ORT transformers optimizer, dynamic int8 quantisation, fp16.

Each takes a graph and returns a new one; :func:`dialogue_safety.core.variants.derive` picks one by recipe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dialogue_safety.core.variants.stamps import get_meta, set_meta

log = logging.getLogger("dialogue_safety.core.variants")

_FP16_SUFFIX = "__fp16"
MS_DOMAIN = "com.microsoft"  # onnxruntime's contrib ops


def store_weights_fp16(model: onnx.ModelProto, min_elements: int = 16) -> tuple[onnx.ModelProto, int]:
    """Store every fp32 initializer that fp16 represents *exactly* as fp16 followed by a Cast.

    Returns the new model and the number of initializers converted. Initializers whose values
    do not survive the fp16 round trip (e.g. ``-3.4e38`` mask constants) and tiny ones stay fp32,
    so the graph computes exactly what it computed before; round the weights to fp16 first
    (``export --ship`` does) to make all of them representable.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    graph_inputs = {i.name for i in graph.input}
    kept: list[onnx.TensorProto] = []
    casts: list[onnx.NodeProto] = []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or init.name in graph_inputs:
            kept.append(init)
            continue
        arr = numpy_helper.to_array(init)
        if arr.size < min_elements:
            kept.append(init)
            continue
        with np.errstate(over="ignore"):
            half = arr.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), arr):
            kept.append(init)
            continue
        stored = f"{init.name}{_FP16_SUFFIX}"
        kept.append(numpy_helper.from_array(half, stored))
        casts.append(
            helper.make_node("Cast", [stored], [init.name], name=f"{init.name}/cast_fp32", to=TensorProto.FLOAT)
        )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(casts + nodes)
    set_meta(out, {"weights_storage": "fp16"})
    return out, len(casts)


def fold_fp16_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Inverse of :func:`store_weights_fp16`: fp16 initializer + Cast → fp32 initializer (exact)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    folded: dict[str, onnx.TensorProto] = {}
    drop_nodes: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.op_type != "Cast" or len(node.input) != 1 or node.input[0] not in inits:
            continue
        src = inits[node.input[0]]
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if src.data_type != TensorProto.FLOAT16 or to != TensorProto.FLOAT:
            continue
        folded[node.output[0]] = numpy_helper.from_array(numpy_helper.to_array(src).astype(np.float32), node.output[0])
        consumers[src.name] -= 1
        drop_nodes.add(i)
    if not folded:
        return out
    remaining = [n for i, n in enumerate(graph.node) if i not in drop_nodes]
    kept = [i for i in graph.initializer if not (i.data_type == TensorProto.FLOAT16 and consumers.get(i.name, 0) == 0)]
    del graph.node[:]
    graph.node.extend(remaining)
    del graph.initializer[:]
    graph.initializer.extend(kept + list(folded.values()))
    set_meta(out, {"weights_storage": "fp32"})
    return out


def weights_storage(model: onnx.ModelProto) -> str:
    """``"fp16"`` for a graph written by :func:`store_weights_fp16`, else ``"fp32"``."""
    return get_meta(model).get("weights_storage", "fp32")


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Raise the named loggers to ERROR while the block runs, then restore their levels."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def quiet_onnxruntime_tools() -> contextlib.AbstractContextManager[None]:
    """Silence the optimizer's and quantizer's chatter while they run.

    onnxruntime.transformers puts its folder on sys.path, so its modules log under top-level
    names (``onnx_model_bert``...); the quantizer logs to the root logger.
    """
    import onnxruntime

    package = os.path.dirname(onnxruntime.__file__)
    names = {"", "onnxruntime"}
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(package):
            names.add(name)
    return quiet_loggers(*sorted(names))


def optimize(model: onnx.ModelProto, recipe: Mapping[str, Any], num_heads: int, hidden_size: int) -> onnx.ModelProto:
    # imported here: onnxruntime.transformers puts its own folder on sys.path when imported
    from onnxruntime.transformers.optimizer import optimize_model

    with quiet_onnxruntime_tools():
        optimizer = optimize_model(
            copy_model(model),
            model_type=str(recipe.get("model_type", "bert")),
            num_heads=num_heads,
            hidden_size=hidden_size,
            opt_level=int(recipe.get("opt_level", 0)),
            use_gpu=bool(recipe.get("use_gpu", False)),
        )
    optimizer.topological_sort()
    fused = {k: v for k, v in optimizer.get_fused_operator_statistics().items() if v}
    if (
        recipe.get("model_type", "bert") == "bert"
        and not fused.get("Attention")
        and not fused.get("MultiHeadAttention")
    ):
        log.warning("the optimizer fused no attention in this graph: %s", fused)
    return with_ms_domain(optimizer.model)


def with_ms_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """Declare the com.microsoft opset when fused contrib ops are present (as OnnxModel.save does)."""
    uses_ms = any(node.domain == MS_DOMAIN for node in model.graph.node)
    if uses_ms and not any(opset.domain == MS_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return model


def excluded_nodes(model: onnx.ModelProto, recipe: Mapping[str, Any]) -> list[str]:
    """The nodes an int8 recipe keeps in fp32: those matching its ``exclude_patterns`` (regular
    expressions over node names) and the outlier-channel products of :func:`split_outlier_channels`."""
    patterns = [re.compile(p) for p in recipe.get("exclude_patterns") or []]
    excluded = [n.name for n in model.graph.node if n.name and any(p.search(n.name) for p in patterns)]
    if patterns and not excluded:
        log.warning("int8 recipe: exclude_patterns %s match no node", recipe["exclude_patterns"])
    return excluded + [n.name for n in model.graph.node if FP32_OUTLIERS in n.name]


def quantize(model: onnx.ModelProto, recipe: Mapping[str, Any]) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type = getattr(QuantType, str(recipe.get("weight_type", "QInt8")))
    excluded = excluded_nodes(model, recipe)
    with tempfile.TemporaryDirectory(prefix="dialogue-safety-int8-") as tmp, quiet_onnxruntime_tools():
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(model, str(src))
        quantize_dynamic(
            src,
            dst,
            op_types_to_quantize=list(recipe.get("op_types") or []) or None,
            per_channel=bool(recipe.get("per_channel", False)),
            reduce_range=bool(recipe.get("reduce_range", False)),
            weight_type=weight_type,
            nodes_to_exclude=excluded or None,
            # fused contrib ops (Attention, SkipLayerNormalization) defeat onnx shape inference
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
        return onnx.load(str(dst))


def to_float16(model: onnx.ModelProto, recipe: Mapping[str, Any]) -> onnx.ModelProto:
    from onnxruntime.transformers.onnx_model import OnnxModel

    wrapped = OnnxModel(model)
    with quiet_onnxruntime_tools():
        wrapped.convert_float_to_float16(keep_io_types=bool(recipe.get("keep_io_types", True)))
    wrapped.topological_sort()
    return with_ms_domain(wrapped.model)


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def quantize_static_qdq(
    model: onnx.ModelProto, recipe: Mapping[str, Any], feeds: list[dict[str, np.ndarray]]
) -> onnx.ModelProto:
    """Calibrated static int8 (QDQ): per-channel int8 weights, per-tensor uint8 activation ranges fixed
    from ``feeds`` (the model directory's calibration rows) with ``recipe["calibrate_method"]``
    (MinMax, Entropy or Percentile).

    Only the inputs of the quantised MatMuls are quantised, and their outputs stay fp32
    (onnxruntime runs DQ → MatMul as an integer MatMul with an fp32 result): with
    ``fp32_residual`` every other consumer of a quantised tensor (the residual Add, Shape) reads
    the fp32 tensor again, so the residual stream never carries int8 rounding. ``exclude_patterns``
    keeps the matching nodes (regular expressions over node names) in fp32: the sensitive ones.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    from dialogue_safety.core.variants.calibration import FeedReader

    method = str(recipe.get("calibrate_method", "MinMax"))
    excluded = excluded_nodes(model, recipe)
    if method != "MinMax":  # the histogram calibrators need one shape: pad every row to the longest
        feeds = _pad_feeds(feeds)
    extra: dict[str, Any] = {
        "MatMulConstBOnly": True,
        "OpTypesToExcludeOutputQuantization": list(recipe.get("op_types") or ["MatMul"]),
        "DefaultTensorType": TensorProto.FLOAT,
    }
    if method == "Percentile":
        extra["CalibPercentile"] = float(recipe.get("percentile", 99.999))
    input_names = [i.name for i in model.graph.input]
    with tempfile.TemporaryDirectory(prefix="dialogue-safety-int8-") as tmp, quiet_onnxruntime_tools():
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(model, str(src))
        quantize_static(
            src,
            dst,
            FeedReader(feeds, input_names),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(recipe.get("op_types") or ["MatMul"]),
            per_channel=bool(recipe.get("per_channel", True)),
            reduce_range=bool(recipe.get("reduce_range", False)),
            activation_type=getattr(QuantType, str(recipe.get("activation_type", "QUInt8"))),
            weight_type=getattr(QuantType, str(recipe.get("weight_type", "QInt8"))),
            nodes_to_exclude=excluded or None,
            calibrate_method=getattr(CalibrationMethod, method),
            calibration_providers=["CPUExecutionProvider"],
            extra_options=extra,
        )
        out = onnx.load(str(dst))
    if recipe.get("fp32_residual", True):
        fp32_residual(out, set(recipe.get("op_types") or ["MatMul"]))
    return out


def fp32_residual(model: onnx.ModelProto, quantized_op_types: set[str]) -> int:
    """Rewire every consumer of a QuantizeLinear → DequantizeLinear pair that is not a quantised op
    back to the fp32 tensor (in place); QDQ nodes left without consumers are removed. Returns the
    number of inputs rewired."""
    producer = {out: node for node in model.graph.node for out in node.output}
    rewired = 0
    for node in model.graph.node:
        if node.op_type in quantized_op_types or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for i, name in enumerate(node.input):
            dq = producer.get(name)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[i] = q.input[0]
                rewired += 1
    drop_dead_nodes(model, {"QuantizeLinear", "DequantizeLinear"})  # the Q/DQ nodes nobody reads any more
    return rewired


def names_read(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name the nodes of ``graph`` read, those read inside their subgraphs (If, Loop, Scan
    bodies) included, and the graph's outputs."""
    names = {o.name for o in graph.output}
    for node in graph.node:
        names.update(node.input)
        for sub in subgraphs(node):
            names |= names_read(sub)
    return names


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held in ``node``'s attributes (If branches, Loop and Scan bodies)."""
    return [g for a in node.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs))]


def drop_dead_nodes(model: onnx.ModelProto, op_types: set[str]) -> None:
    """Remove the nodes of ``op_types`` whose outputs nothing reads (no node, subgraphs included, and no
    graph output; repeatedly: a node left without readers by a removal goes too), in place."""
    while True:
        used = names_read(model.graph)
        keep = [n for n in model.graph.node if n.op_type not in op_types or any(o in used for o in n.output)]
        if len(keep) == len(model.graph.node):
            break
        del model.graph.node[:]
        model.graph.node.extend(keep)


def _pad_feeds(feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    width = max(f["input_ids"].shape[1] for f in feeds)
    out = []
    for feed in feeds:
        extra = width - feed["input_ids"].shape[1]
        out.append({k: np.pad(v, ((0, 0), (0, extra))) for k, v in feed.items()})  # pad id 0, mask 0, segment 0
    return out


def quantize_matmul_nbits(model: onnx.ModelProto, recipe: Mapping[str, Any]) -> onnx.ModelProto:
    """Blockwise int8 weights (``MatMulNBits``, ``bits`` 8, ``block_size`` along the input dimension,
    symmetric) with ``accuracy_level`` 4: onnxruntime quantises each row of the activations per block
    too and multiplies in int8 (VNNI on x86), so an outlier only coarsens its own block of 32..128
    values instead of the whole tensor, as per-tensor dynamic or static scales do."""
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    except ImportError as exc:  # it imports onnx_ir, which older serve environments lack
        raise RuntimeError(
            f"the nbits8 int8 recipe needs onnxruntime's MatMulNBits quantizer ({exc}): "
            "pip install 'dialogue-safety[serve]' (it brings onnx-ir)"
        ) from exc

    bits, block = int(recipe.get("bits", 8)), int(recipe.get("block_size", 128))
    accuracy = int(recipe.get("accuracy_level", 4))
    op_types = tuple(recipe.get("op_types") or ["MatMul"])
    config = DefaultWeightOnlyQuantConfig(
        block_size=block, is_symmetric=True, accuracy_level=accuracy, bits=bits, op_types_to_quantize=op_types
    )
    with quiet_onnxruntime_tools():
        quantizer = MatMulNBitsQuantizer(
            copy_model(model),
            bits=bits,
            block_size=block,
            is_symmetric=True,
            accuracy_level=accuracy,
            algo_config=config,
            op_types_to_quantize=op_types,
        )
        quantizer.process()
    return with_ms_domain(quantizer.model.model)


FP32_OUTLIERS = "/fp32_outliers"  # the name part of the nodes split_outlier_channels adds (never quantised)


def activation_ranges(
    model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], tensors: list[str]
) -> dict[str, np.ndarray]:
    """{tensor: per-channel (last axis) max |value| over ``feeds``} by running ``model`` with ``tensors`` as outputs."""
    import onnxruntime as ort

    probe = copy_model(model)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in tensors)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs() if o.name not in have]
    inputs = {i.name for i in session.get_inputs()}
    amax: dict[str, np.ndarray] = {}
    for feed in feeds:
        got = session.run(names, {k: v for k, v in feed.items() if k in inputs})
        for name, value in zip(names, got, strict=True):
            m = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            amax[name] = m if name not in amax else np.maximum(amax[name], m)
    return amax


def split_outlier_channels(
    model: onnx.ModelProto,
    feeds: list[dict[str, np.ndarray]],
    patterns: tuple[str, ...],
    channels: int,
    *,
    min_ratio: float = 0.0,
    zero_rows: bool = False,
    chosen: Mapping[str, Sequence[int]] | None = None,
) -> tuple[onnx.ModelProto, int]:
    """Compute the ``channels`` input channels with the widest calibration range of every matching
    MatMul in fp32 apart: ``X W = (X * mask) W + X[..., idx] W[idx]``. The masked product is what
    int8 quantisation then sees, so its per-tensor activation scale is set by the ordinary channels
    (a GELU output with one channel reaching 24 where the others stay under 7 otherwise spends most
    of its 256 levels on that channel). In fp32 the result is the same function.

    ``min_ratio`` > 0 splits only the MatMuls whose widest input channel reaches ``min_ratio`` x the
    widest channel left in the product (the ``channels + 1``-th): a layer without outliers keeps its
    one product. ``zero_rows`` also zeroes rows ``idx`` of the masked product's weight (the same
    function: those inputs are masked to 0), which lets :func:`saturate_outlier_masks` drop the mask
    once the activation scales are fixed. ``chosen`` ({MatMul name: channel indices}, what an earlier split
    of the same graph and rows chose: :func:`split_channels_of`) splits those channels without running the
    graph over ``feeds`` (a first start's derivation then skips that pass). Returns the graph and the number
    of MatMuls split."""
    out = copy_model(model)
    inits = {i.name: i for i in out.graph.initializer}
    wanted = [re.compile(p) for p in patterns]
    targets = {
        n.name: n
        for n in out.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits and any(p.search(n.name) for p in wanted)
    }
    picked: dict[str, np.ndarray] = {}
    if chosen is not None:
        unknown = sorted(set(chosen) - set(targets))
        if unknown:
            raise ValueError(f"recorded outlier channels name MatMuls the recipe does not split: {unknown[:3]}")
        picked = {name: np.sort(np.asarray(list(idx), dtype=np.int64)) for name, idx in chosen.items()}
    else:
        amax = activation_ranges(out, feeds, sorted({n.input[0] for n in targets.values()}))
        for name, node in targets.items():
            ranges = amax[node.input[0]]
            if min_ratio > 0:
                widest = np.sort(ranges)[::-1]
                if ranges.size <= channels or not widest[0] >= min_ratio * widest[channels]:  # NaN: not an outlier
                    continue  # no outlier here: one int8 product
            picked[name] = np.sort(np.argsort(-ranges, kind="stable")[:channels]).astype(np.int64)
    nodes: list[onnx.NodeProto] = []
    split = 0
    replaced: set[str] = set()
    for node in out.graph.node:
        idx = picked.get(node.name) if node.name in targets else None
        if idx is None:
            nodes.append(node)
            continue
        split += 1
        weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        mask = np.ones(weight.shape[0], dtype=np.float32)
        mask[idx] = 0.0
        base = f"{node.name}{FP32_OUTLIERS}"
        x, y = node.input[0], node.output[0]
        out.graph.initializer.extend(
            [
                numpy_helper.from_array(mask, f"{base}/mask"),
                numpy_helper.from_array(idx, f"{base}/channels"),
                numpy_helper.from_array(weight[idx], f"{base}/weight"),
            ]
        )
        if zero_rows:
            rest = weight.copy()
            rest[idx] = 0.0
            out.graph.initializer.append(numpy_helper.from_array(rest, f"{base}/rest_weight"))
            replaced.add(node.input[1])
            node.input[1] = f"{base}/rest_weight"
        nodes += [
            helper.make_node("Mul", [x, f"{base}/mask"], [f"{base}/masked"], f"{base}/Mul"),
            helper.make_node("Gather", [x, f"{base}/channels"], [f"{base}/picked"], f"{base}/Gather", axis=-1),
            helper.make_node("MatMul", [f"{base}/picked", f"{base}/weight"], [f"{base}/part"], f"{base}/MatMul"),
        ]
        node.input[0] = f"{base}/masked"
        node.output[0] = f"{base}/rest"
        nodes += [node, helper.make_node("Add", [f"{base}/rest", f"{base}/part"], [y], f"{base}/Add")]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    if replaced:  # the weights a zeroed copy replaced, unless something else reads them
        drop_unused_initializers(out, among=replaced)
    return out, split


def split_channels_of(model: onnx.ModelProto) -> dict[str, list[int]]:
    """{MatMul name: channel indices} that :func:`split_outlier_channels` computed apart in ``model``."""
    suffix = f"{FP32_OUTLIERS}/channels"
    return {
        i.name[: -len(suffix)]: [int(c) for c in numpy_helper.to_array(i)]
        for i in model.graph.initializer
        if i.name.endswith(suffix)
    }


def drop_unused_initializers(model: onnx.ModelProto, among: set[str] | None = None) -> None:
    """Remove the initializers (of ``among``, or all) that nothing reads (no node, subgraphs included, and
    no graph output), in place."""
    used = names_read(model.graph)
    kept = [i for i in model.graph.initializer if i.name in used or (among is not None and i.name not in among)]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)


def saturate_outlier_masks(model: onnx.ModelProto) -> int:
    """Drop the masks of :func:`split_outlier_channels` (``zero_rows``) from a static QDQ graph, in place:
    its QuantizeLinear reads the unmasked input. The product stays the masked one exactly because the
    weight rows of those channels are zero (an int8 zero row adds nothing, whatever the quantised
    activation, which may saturate at the fixed scale's ends), and one elementwise pass per split
    MatMul is saved. Refuses (``ValueError``) a split made without ``zero_rows``. Returns the number
    of masks dropped."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    masks = [n for n in model.graph.node if n.op_type == "Mul" and n.name.endswith(f"{FP32_OUTLIERS}/Mul")]
    weights = [i.name for i in model.graph.initializer]
    for mul in masks:
        base = mul.name[: -len("/Mul")]
        if not any(name.startswith(f"{base}/rest_weight") for name in weights):
            raise ValueError(f"{mul.name}: its weight rows were not zeroed (split without zero_rows): the mask stays")
        readers = consumers.get(mul.output[0], [])
        if not readers or any(r.op_type != "QuantizeLinear" for r in readers):
            raise ValueError(f"{mul.name}: its output is read by more than fixed-scale QuantizeLinear nodes")
        for reader in readers:
            reader.input[0] = mul.input[0]
    dropped = {n.name for n in masks}
    nodes = [n for n in model.graph.node if n.name not in dropped]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    drop_unused_initializers(model)
    return len(masks)
