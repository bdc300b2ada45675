"""Graph rewrites that change how onnxruntime's CPU kernels compute a variant, not what it computes.

On an int8 graph onnxruntime fuses each feed-forward block's residual Add and LayerNormalization into a
SkipLayerNormalization whose CPU kernel is slower than the unfused pair; it leaves every linear layer's bias
as an Add after the integer MatMul and fuses the feed-forward bias into a BiasGelu slower than the Gelu it
would otherwise be; and it materialises K^T for the attention scores with a transpose that moves single
floats where moving whole heads costs less. What each rewrite saved, measured: lab/notes/runtime.md,
"int8 for 0.4.0, fourth pass".

Each rewrite is exact up to float rounding order (tested against the graph it rewrites), applies
where its pattern is found and leaves the rest alone, and returns how many places it changed.
:func:`apply` runs the ones a recipe names (``recipe["rewrites"]``), in :data:`REWRITES` order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import onnx
from onnx import TensorProto, helper

from dialogue_safety.core.variants.graphs import (
    MS_DOMAIN,
    drop_dead_nodes,
    drop_unused_initializers,
    names_read,
    subgraphs,
    with_ms_domain,
)

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE}  # what FusedMatMul takes
INT8_TYPES = {TensorProto.INT8, TensorProto.UINT8}  # what MatMulIntegerToFloat takes
Inferred = dict[str, tuple[int, list[int | None]]]  # tensor -> (element type, dims; None where symbolic)


class _Graph:
    """One pass over ``model``'s top-level nodes: who produces and who reads each tensor, and the
    replacements to put in place (by position: :meth:`commit`, which also restores topological order)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.nodes = list(model.graph.node)
        self.position = {id(n): i for i, n in enumerate(self.nodes)}  # the wrappers stay alive in self.nodes
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in model.graph.output}
        self.in_subgraphs = set().union(
            *(names_read(sub) for n in self.nodes for sub in subgraphs(n))  # implicit readers
        )
        self.inits = {i.name: i for i in model.graph.initializer}
        for node in self.nodes:  # torch.onnx names one tensor of identical weights through Identity nodes
            if node.op_type == "Identity" and node.input[0] in self.inits:
                self.inits[node.output[0]] = self.inits[node.input[0]]
        self.replaced: dict[int, onnx.NodeProto | None] = {}

    def only_reader(self, name: str) -> onnx.NodeProto | None:
        """The one node that reads ``name``, unless several do, a subgraph does, or it is a graph output."""
        found = self.readers.get(name, [])
        ok = len(found) == 1 and name not in self.outputs and name not in self.in_subgraphs
        return found[0] if ok else None

    def replace(self, node: onnx.NodeProto, by: onnx.NodeProto | None) -> None:
        self.replaced[self.position[id(node)]] = by

    def commit(self) -> int:
        """Put the replacements in place (None: dropped), in a topological order that keeps the original
        one wherever it can; returns how many nodes were replaced by another."""
        nodes = [self.replaced.get(i, n) for i, n in enumerate(self.nodes)]
        _put_in_order(self.model.graph, [n for n in nodes if n is not None])
        with_ms_domain(self.model)
        return sum(1 for n in self.replaced.values() if n is not None)


def _put_in_order(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """``graph.node`` = ``nodes``, each placed after the producers of what it reads (its subgraphs'
    outer-scope reads included), otherwise in the given order."""
    produced = {out for n in nodes for out in n.output}
    needs = [(set(n.input) | set().union(*(names_read(g) for g in subgraphs(n)))) & produced for n in nodes]
    done: set[str] = set()
    ordered: list[onnx.NodeProto] = []
    pending = list(range(len(nodes)))
    while pending:
        ready = [i for i in pending if needs[i] <= done]
        if not ready:
            raise ValueError("the rewritten graph has a cycle")
        first = ready[0]
        ordered.append(nodes[first])
        done.update(nodes[first].output)
        pending.remove(first)
    del graph.node[:]
    graph.node.extend(ordered)


def _one_element(init: onnx.TensorProto | None) -> bool:
    return init is not None and math.prod(init.dims) == 1


def integer_matmul_bias(model: onnx.ModelProto) -> int:
    """Each QDQ MatMul (uint8/int8 activations at a fixed per-tensor scale, int8 weights with per-tensor or
    per-column scales) becomes one ``com.microsoft.MatMulIntegerToFloat`` that also adds the layer's bias,
    in place: ``Q(x) -> DQ -> MatMul(., DQ(W)) -> Add(bias)`` -> ``Q(x) -> MatMulIntegerToFloat(xq, Wq,
    scales, zero points, bias)``. onnxruntime builds the same integer MatMul from the QDQ pattern at load
    but leaves the bias to a separate Add, or fuses it with a following GELU into a slower BiasGelu.
    With an outlier split (``rest + part`` before the bias, graphs.split_outlier_channels) the bias
    joins the integer ``rest``. Returns the number of MatMuls rewritten."""
    g = _Graph(model)
    for node in g.nodes:
        if node.op_type != "MatMul" or node.domain:
            continue
        dq_a, dq_w = g.producer.get(node.input[0]), g.producer.get(node.input[1])
        if dq_a is None or dq_w is None or dq_a.op_type != "DequantizeLinear" or dq_w.op_type != "DequantizeLinear":
            continue
        if not _per_tensor(dq_a, g.inits) or not _per_column(dq_w, g.inits):
            continue
        site = _bias_site(node.output[0], g.inits[dq_w.input[0]].dims[1], g)
        inputs = [dq_a.input[0], dq_w.input[0], dq_a.input[1], dq_w.input[1], dq_a.input[2], dq_w.input[2]]
        out = node.output[0]
        if site is not None:
            bias_add, outlier_add, bias = site
            inputs.append(bias)
            g.replace(bias_add, None)
            if outlier_add is None:
                out = bias_add.output[0]
            else:
                outlier_add.output[0] = bias_add.output[0]
        g.replace(node, helper.make_node("MatMulIntegerToFloat", inputs, [out], name=node.name, domain=MS_DOMAIN))
    if not g.replaced:
        return 0
    changed = g.commit()
    dequantized = {i for n in g.nodes if n.op_type == "DequantizeLinear" for i in n.input}
    drop_dead_nodes(model, {"DequantizeLinear"})
    drop_unused_initializers(model, among=dequantized)  # what only the dropped DequantizeLinear nodes read
    return changed


def _per_tensor(dq: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A DequantizeLinear of 8-bit activations with one constant scale and zero point."""
    if len(dq.input) < 3 or any(a.name == "block_size" for a in dq.attribute):
        return False
    scale, zero = inits.get(dq.input[1]), inits.get(dq.input[2])
    return _one_element(scale) and _one_element(zero) and zero is not None and zero.data_type in INT8_TYPES


def _per_column(dq: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    """A DequantizeLinear of a constant 2-D 8-bit weight [K, N] with one scale or one per column (axis 1)."""
    weight = inits.get(dq.input[0])
    if weight is None or len(weight.dims) != 2 or weight.data_type not in INT8_TYPES or len(dq.input) < 3:
        return False
    if any(a.name == "block_size" for a in dq.attribute):
        return False
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    scale, zero = inits.get(dq.input[1]), inits.get(dq.input[2])
    if scale is None or zero is None or zero.data_type != weight.data_type or list(scale.dims) != list(zero.dims):
        return False
    return _one_element(scale) or (list(scale.dims) == [weight.dims[1]] and axis in (1, -1))


def _bias_site(y: str, columns: int, g: _Graph) -> tuple[onnx.NodeProto, onnx.NodeProto | None, str] | None:
    """Where the bias of a MatMul with output ``y`` is added: ``(bias Add, outlier Add or None, bias name)``
    for ``Add(y, bias)`` or ``Add(Add(y, part), bias)`` (an outlier split's ``rest + part``), where
    ``bias`` is a 1-D constant of ``columns`` values and each step has one reader; None otherwise."""
    after = g.only_reader(y)
    if after is None or after.op_type != "Add" or g.position[id(after)] in g.replaced:
        return None
    bias = _bias_of(after, y, g.inits, columns)
    if bias is not None:
        return after, None, bias
    part = after.input[1] if after.input[0] == y else after.input[0]
    nxt = g.only_reader(after.output[0])
    if part in g.inits or nxt is None or nxt.op_type != "Add" or g.position[id(nxt)] in g.replaced:
        return None
    bias = _bias_of(nxt, after.output[0], g.inits, columns)
    return (nxt, after, bias) if bias is not None else None


def _bias_of(add: onnx.NodeProto, x: str, inits: dict[str, onnx.TensorProto], columns: int) -> str | None:
    """The name of ``add``'s other input when it is a 1-D float constant of ``columns`` values, else None."""
    other = add.input[1] if add.input[0] == x else add.input[0]
    init = inits.get(other)
    ok = init is not None and list(init.dims) == [columns] and init.data_type == TensorProto.FLOAT
    return other if ok else None


def scores_transpose(model: onnx.ModelProto) -> int:
    """``MatMul(A, Transpose(y, perm=p))`` where ``p`` moves ``y``'s last axis (BERT's K^T: perm 0,2,3,1)
    becomes ``FusedMatMul(A, Transpose(y, perm=p'), transB=1)`` with ``p'`` = ``p`` with its last two
    entries swapped (0,2,1,3: whole heads move, not single floats), in place; the GEMM's own
    transposed-B path reads it. Multiplications by a one-element tensor between the two (BERT's
    scaling of K) commute with the transpose and stay. Float MatMuls only (by onnx shape inference).
    Returns the number of MatMuls rewritten."""
    g = _Graph(model)
    info = _inferred(model)
    for node in g.nodes:
        if node.op_type != "MatMul" or node.domain or info.get(node.output[0], (None, None))[0] not in FLOAT_TYPES:
            continue
        name, transpose = node.input[1], None
        while True:
            step = g.producer.get(name)
            if step is None or g.only_reader(name) is None:
                break
            if step.op_type == "Mul" and len(step.input) == 2:
                scalars = [i for i in step.input if _holds_one_element(i, g.inits, info)]
                if len(scalars) == 1 or (len(scalars) == 2 and step.input[0] == step.input[1]):
                    name = step.input[1] if scalars[0] == step.input[0] else step.input[0]
                    continue
                break
            if step.op_type == "Transpose":
                transpose = step
            break
        if transpose is None:
            continue
        perm = list(next((a.ints for a in transpose.attribute if a.name == "perm"), []))
        if len(perm) < 3 or perm[-2] != len(perm) - 1:
            continue  # no perm given, or the last axis is not moved next to last
        for a in transpose.attribute:
            if a.name == "perm":
                a.ints[:] = perm[:-2] + [perm[-1], perm[-2]]
        fused = helper.make_node("FusedMatMul", list(node.input), list(node.output), name=node.name, transB=1)
        fused.domain = MS_DOMAIN
        g.replace(node, fused)
    return g.commit() if g.replaced else 0


def _inferred(model: onnx.ModelProto) -> Inferred:
    """{tensor: (element type, dims, None where symbolic)} from onnx shape inference on a copy without the
    model's own value_info (a stale annotation must not count); graph inputs and initializers included."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.value_info[:]
    try:
        probe = onnx.shape_inference.infer_shapes(probe)
    except Exception:  # inference errors: nothing is known beyond the constants
        del probe.graph.value_info[:]
    out: Inferred = {}
    for vi in list(probe.graph.input) + list(probe.graph.value_info):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = (t.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim])
    for vi in probe.graph.output:  # their type, not their declared dims (which inference keeps as they are)
        out.setdefault(vi.name, (vi.type.tensor_type.elem_type, [None]))
    for init in model.graph.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    return out


def _holds_one_element(name: str, inits: dict[str, onnx.TensorProto], info: Inferred) -> bool:
    if _one_element(inits.get(name)):
        return True
    dims = info.get(name, (None, None))[1]
    return dims is not None and all(d == 1 for d in dims)


def residual_sum(model: onnx.ModelProto) -> int:
    """Each ``Add`` of two computed tensors that only a LayerNormalization reads becomes a ``Sum`` (the same
    elementwise addition, broadcasting alike), in place: onnxruntime fuses Add + LayerNormalization into
    SkipLayerNormalization, whose CPU kernel is slower than the pair (lab/notes/runtime.md), and does not fuse
    Sum. Returns the number of Adds rewritten."""
    g = _Graph(model)
    constants = set(g.inits) | {n.output[0] for n in g.nodes if n.op_type == "Constant"}
    changed = 0
    for node in g.nodes:
        if node.op_type != "Add" or node.domain or len(node.input) != 2 or set(node.input) & constants:
            continue
        reader = g.only_reader(node.output[0])
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
