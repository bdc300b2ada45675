"""Graph rewrites that change how onnxruntime's CPU kernels compute a variant, not what it computes.

Measured on 0.4.0's static int8 graph (2 threads, 2,800 length-sorted rows in batches of 64, model only,
docs/runtime.md "int8 for 0.4.0, fourth pass"): onnxruntime fuses each feed-forward block's residual Add
and LayerNormalization into a SkipLayerNormalization whose CPU kernel took 0.37 s where the unfused pair
takes 0.06 s; it leaves every linear layer's bias as an Add after the integer MatMul (0.07 s) and fuses the
feed-forward bias into a BiasGelu that is 0.13 s slower than the Gelu it would otherwise be; and it
materialises K^T for the attention scores with a transpose that moves single floats (0.13 s) where moving
whole heads costs a third. Together 2.43 -> 2.03 s (static) and 2.78 -> 2.36 s (static-split-lean).

Each rewrite is exact up to float rounding order (tested against the graph it rewrites), applies
where its pattern is found and leaves the rest alone, and returns how many places it changed.
:func:`apply` runs the ones a recipe names (``recipe["rewrites"]``), in :data:`REWRITES` order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx
from onnx import helper, numpy_helper

from dialogue_safety.core.variants.graphs import drop_dead_nodes, drop_unused_initializers, with_ms_domain

MS_DOMAIN = "com.microsoft"


def _consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _only_reader(name: str, readers: dict[str, list[onnx.NodeProto]], outputs: set[str]) -> onnx.NodeProto | None:
    """The one node that reads ``name``, unless it is read by several or is a graph output."""
    found = readers.get(name, [])
    return found[0] if len(found) == 1 and name not in outputs else None


def _replace_nodes(model: onnx.ModelProto, replaced: dict[int, onnx.NodeProto | None]) -> None:
    """Put each node ``id`` -> replacement (None: drop) in place, keeping the order."""
    nodes = [replaced.get(id(n), n) for n in model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(n for n in nodes if n is not None)


def integer_matmul_bias(model: onnx.ModelProto) -> int:
    """Each QDQ MatMul (uint8 activations at a fixed scale, int8 weights) becomes one
    ``com.microsoft.MatMulIntegerToFloat`` that also adds the layer's bias, in place:
    ``Q(x) -> DQ -> MatMul(., DQ(W)) -> Add(bias)`` -> ``Q(x) -> MatMulIntegerToFloat(xq, Wq, scales,
    zero points, bias)``. onnxruntime builds the same integer MatMul from the QDQ pattern at load but
    leaves the bias to a separate Add, or fuses it with a following GELU into a slower BiasGelu.
    With an outlier split (``rest + part`` before the bias, graphs.split_outlier_channels) the bias
    joins the integer ``rest``. Returns the number of MatMuls rewritten."""
    producer = {out: n for n in model.graph.node for out in n.output}
    readers = _consumers(model)
    outputs = {o.name for o in model.graph.output}
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:  # torch.onnx names one tensor of identical weights through Identity nodes
        if node.op_type == "Identity" and node.input[0] in inits:
            inits[node.output[0]] = inits[node.input[0]]
    replaced: dict[int, onnx.NodeProto | None] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.domain:
            continue
        dq_a, dq_w = producer.get(node.input[0]), producer.get(node.input[1])
        if dq_a is None or dq_w is None or dq_a.op_type != "DequantizeLinear" or dq_w.op_type != "DequantizeLinear":
            continue
        if dq_w.input[0] not in inits or len(inits[dq_w.input[0]].dims) != 2:
            continue
        if len(dq_a.input) > 1 and dq_a.input[1] in inits and len(inits[dq_a.input[1]].dims) > 0:
            continue  # a per-channel activation scale: not what MatMulIntegerToFloat takes
        site = _bias_site(node.output[0], inits[dq_w.input[0]].dims[1], inits, readers, outputs)
        inputs = [dq_a.input[0], dq_w.input[0], _arg(dq_a, 1), _arg(dq_w, 1), _arg(dq_a, 2), _arg(dq_w, 2)]
        out = node.output[0]
        if site is not None:
            bias_add, outlier_add, bias = site
            inputs.append(bias)
            replaced[id(bias_add)] = None
            if outlier_add is None:
                out = bias_add.output[0]
            else:
                outlier_add.output[0] = bias_add.output[0]
        replaced[id(node)] = helper.make_node("MatMulIntegerToFloat", inputs, [out], name=node.name, domain=MS_DOMAIN)
    _replace_nodes(model, replaced)
    drop_dead_nodes(model, {"DequantizeLinear"})
    drop_unused_initializers(model)
    with_ms_domain(model)
    return sum(1 for n in replaced.values() if n is not None)


def _arg(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


def _bias_site(
    y: str,
    columns: int,
    inits: dict[str, onnx.TensorProto],
    readers: dict[str, list[onnx.NodeProto]],
    outputs: set[str],
) -> tuple[onnx.NodeProto, onnx.NodeProto | None, str] | None:
    """Where the bias of a MatMul with output ``y`` is added: ``(bias Add, outlier Add or None, bias name)``
    for ``Add(y, bias)`` or ``Add(Add(y, part), bias)`` (an outlier split's ``rest + part``), where
    ``bias`` is a 1-D constant of ``columns`` values and each step has one reader; None otherwise."""
    after = _only_reader(y, readers, outputs)
    if after is None or after.op_type != "Add":
        return None
    bias = _bias_of(after, y, inits, columns)
    if bias is not None:
        return after, None, bias
    part = after.input[1] if after.input[0] == y else after.input[0]
    nxt = _only_reader(after.output[0], readers, outputs)
    if part in inits or nxt is None or nxt.op_type != "Add":
        return None
    bias = _bias_of(nxt, after.output[0], inits, columns)
    return (nxt, after, bias) if bias is not None else None


def _bias_of(add: onnx.NodeProto, x: str, inits: dict[str, onnx.TensorProto], columns: int) -> str | None:
    """The name of ``add``'s other input when it is a 1-D constant of ``columns`` values, else None."""
    other = add.input[1] if add.input[0] == x else add.input[0]
    init = inits.get(other)
    return other if init is not None and list(init.dims) == [columns] else None


def scores_transpose(model: onnx.ModelProto) -> int:
    """``MatMul(A, Transpose(y, perm=p))`` where ``p`` moves ``y``'s last axis (BERT's K^T: perm 0,2,3,1)
    becomes ``FusedMatMul(A, Transpose(y, perm=p'), transB=1)`` with ``p'`` = ``p`` with its last two
    entries swapped (0,2,1,3: whole heads move, not single floats), in place; the integer GEMM's own
    transposed-B path reads it. Multiplications by a one-element tensor between the two (BERT's
    scaling of K) commute with the transpose and stay. Returns the number of MatMuls rewritten."""
    producer = {out: n for n in model.graph.node for out in n.output}
    readers = _consumers(model)
    outputs = {o.name for o in model.graph.output}
    one_element = _one_element_tensors(model)
    replaced: dict[int, onnx.NodeProto | None] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.domain:
            continue
        name, transpose = node.input[1], None
        while True:
            step = producer.get(name)
            if step is None or _only_reader(name, readers, outputs) is None:
                break
            if step.op_type == "Mul" and len(step.input) == 2 and step.input[1] in one_element:
                name = step.input[0]
                continue
            if step.op_type == "Transpose":
                transpose = step
            break
        if transpose is None:
            continue
        perm = list(next((a.ints for a in transpose.attribute if a.name == "perm"), []))
        if len(perm) < 3 or perm[-2] != len(perm) - 1:
            continue  # no perm given, or the last axis is not moved next to last
        swapped = perm[:-2] + [perm[-1], perm[-2]]
        for a in transpose.attribute:
            if a.name == "perm":
                a.ints[:] = swapped
        replaced[id(node)] = helper.make_node(
            "FusedMatMul", list(node.input), list(node.output), name=node.name, domain=MS_DOMAIN, transB=1
        )
    _replace_nodes(model, replaced)
    with_ms_domain(model)
    return len(replaced)


def _one_element_tensors(model: onnx.ModelProto) -> set[str]:
    """Names of tensors known (initializers, Constant nodes, onnx shape inference) to hold one element."""
    names = {i.name for i in model.graph.initializer if math.prod(i.dims) == 1}
    for node in model.graph.node:
        value = node.attribute[0] if node.op_type == "Constant" and node.attribute else None
        if value is not None and value.name == "value" and numpy_helper.to_array(value.t).size == 1:
            names.add(node.output[0])
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an unknown op: what the initializers and constants say is enough
        return names
    for info in list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = info.type.tensor_type.shape.dim if info.type.tensor_type.HasField("shape") else None
        if dims is not None and all(d.HasField("dim_value") and d.dim_value == 1 for d in dims):
            names.add(info.name)
    return names


def residual_sum(model: onnx.ModelProto) -> int:
    """Each ``Add`` of two computed tensors that only a LayerNormalization reads becomes a ``Sum`` (the same
    elementwise addition), in place: onnxruntime fuses Add + LayerNormalization into SkipLayerNormalization,
    whose CPU kernel measured 6x slower than the pair here, and does not fuse Sum. Returns the number
    of Adds rewritten."""
    readers = _consumers(model)
    outputs = {o.name for o in model.graph.output}
    constants = {i.name for i in model.graph.initializer} | {
        n.output[0] for n in model.graph.node if n.op_type == "Constant"
    }
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Add" or node.domain or len(node.input) != 2 or set(node.input) & constants:
            continue
        reader = _only_reader(node.output[0], readers, outputs)
        if reader is not None and reader.op_type == "LayerNormalization" and reader.input[0] == node.output[0]:
            node.op_type = "Sum"
            changed += 1
    return changed


#: the rewrites a recipe may name, in the order :func:`apply` runs them (shape inference first, while
#: the graph has only standard ops)
REWRITES: dict[str, Callable[[onnx.ModelProto], int]] = {
    "scores_transpose": scores_transpose,
    "residual_sum": residual_sum,
    "integer_matmul_bias": integer_matmul_bias,
}


def apply(model: onnx.ModelProto, names: Sequence[str]) -> dict[str, int]:
    """Run the named rewrites on ``model`` in place; returns how many places each changed.
    Raises ``ValueError`` for a name not in :data:`REWRITES`."""
    unknown = sorted(set(names) - set(REWRITES))
    if unknown:
        raise ValueError(f"unknown graph rewrites {unknown}: known ones are {', '.join(REWRITES)}")
    return {name: fn(model) for name, fn in REWRITES.items() if name in names}
