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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dialogue_safety.core.variants.stamps import get_meta, set_meta

log = logging.getLogger("dialogue_safety.core.variants")

_FP16_SUFFIX = "__fp16"


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
    uses_ms = any(node.domain == "com.microsoft" for node in model.graph.node)
    if uses_ms and not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def quantize(model: onnx.ModelProto, recipe: Mapping[str, Any]) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type = getattr(QuantType, str(recipe.get("weight_type", "QInt8")))
    patterns = [re.compile(p) for p in recipe.get("exclude_patterns") or []]
    excluded = [n.name for n in model.graph.node if n.name and any(p.search(n.name) for p in patterns)]
    if patterns and not excluded:
        log.warning("int8 recipe: exclude_patterns %s match no node; quantising everything", recipe["exclude_patterns"])
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
