"""A torch checkpoint rebuilt from an exported model directory's own weights (the inverse of the export).

    checkpoint_from_model_dir("models/default", "runs/weights-0.4.0")

The shipped model directory holds the ONNX graph, the tokenizer and the card, not the checkpoint it was
exported from (checkpoints are not committed). The speed benchmarks compare the project's variants with what a
user gets from the *checkpoint* (a plain ``torch.onnx.export`` and ``quantize_dynamic``; torch eager), so
without it they could not run from a clean checkout. The graph's weights are the checkpoint's (rounded to fp16
when shipped, which is what every variant serves), named by torch.onnx after the module that owns them: each
parameter is an initializer of its own name, except the linear layers' weights, which are read through the
MatMul node that multiplies by them (``/bert/encoder/layer.0/attention/self/query/MatMul`` ->
``bert.encoder.layer.0.attention.self.query.weight``, transposed). Every parameter of the rebuilt model must be
found (no missing or unexpected tensor), and its logits must match the model directory's fp32 graph within the
export's tolerance on a few dialogues, or :class:`ExportError` says what differs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from tokenizers import Tokenizer
from transformers import BertConfig, BertForSequenceClassification

from dialogue_safety.core import variants
from dialogue_safety.core.encoding import DialogueEncoder, pad_batch
from dialogue_safety.core.model_card import TOKENIZER_FILE, ModelCard
from dialogue_safety.core.schema import Example
from dialogue_safety.export.onnx_export import ExportError, torch_reference
from dialogue_safety.export.settings import DEFAULT_TOLERANCE
from dialogue_safety.training.checkpoint import save_checkpoint

#: the geometry a rebuilt model needs from the card (``export.geometry``, written by every export)
GEOMETRY_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
#: dialogues whose logits the rebuilt model must reproduce (with and without history, short and long)
PROBES = (
    Example.from_texts("you are a clown", ["what do you think of me?"]),
    Example.from_texts("Have a lovely day!"),
    Example.from_texts(" ".join(["that was a long and winding story"] * 12), ["tell me a story", "sure, here goes"]),
)


def parameters_from_graph(graph: onnx.ModelProto) -> dict[str, np.ndarray]:
    """{torch parameter name: array} of a torch.onnx export of a Hugging Face model, read through the node that
    uses each weight (torch.onnx names nodes after their module and shares equal initializers through Identity
    nodes, e.g. a random model's LayerNorm weights of ones): a MatMul's weight (transposed back to torch's
    [out, in]), the bias Add after it, a Gemm's weight and bias, a LayerNormalization's scale and bias, an
    embedding Gather's table. Initializers named after a parameter fill in what no node names."""
    inits = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    for node in graph.graph.node:  # torch.onnx aliases a shared initializer through Identity nodes
        if node.op_type == "Identity" and node.input[0] in inits:
            inits[node.output[0]] = inits[node.input[0]]
    params = {name: value for name, value in inits.items() if not name.startswith("onnx::") and "/" not in name}
    for node in graph.graph.node:
        module = node.name.strip("/").rsplit("/", 1)[0].replace("/", ".")
        ins = list(node.input)
        if node.op_type == "MatMul" and len(ins) == 2 and ins[1] in inits:
            params[f"{module}.weight"] = inits[ins[1]].T
        elif node.op_type == "Gemm" and len(ins) >= 2 and ins[1] in inits:
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            params[f"{module}.weight"] = inits[ins[1]] if trans_b else inits[ins[1]].T
            if len(ins) == 3 and ins[2] in inits:
                params[f"{module}.bias"] = inits[ins[2]]
        elif node.op_type == "Add":
            bias = [i for i in ins if i in inits and inits[i].ndim == 1]
            if len(bias) == 1 and len(ins) == 2:
                params[f"{module}.bias"] = inits[bias[0]]
        elif node.op_type == "LayerNormalization" and len(ins) == 3 and ins[1] in inits and ins[2] in inits:
            params[f"{module}.weight"], params[f"{module}.bias"] = inits[ins[1]], inits[ins[2]]
        elif node.op_type == "Gather" and ins and ins[0] in inits and inits[ins[0]].ndim == 2:
            params[f"{module}.weight"] = inits[ins[0]]
    return params


def checkpoint_from_model_dir(model_dir: str | Path, out: str | Path) -> Path:
    """Write a checkpoint (:mod:`dialogue_safety.training.checkpoint`) with ``model_dir``'s weights, tokenizer and
    card to ``out``; its logits are checked against the directory's fp32 graph. Returns ``out``."""
    model_dir = Path(model_dir)
    card = ModelCard.load(model_dir)
    geometry = card.export.get("geometry") or {}
    missing = [k for k in GEOMETRY_KEYS if k not in geometry]
    if missing:
        raise ExportError(f"{model_dir}: the card's export.geometry lacks {missing}; re-export the checkpoint")
    fp32 = variants.ensure_variant(model_dir, "fp32", card)
    graph = onnx.load(str(fp32))
    epsilons = [
        a.f for n in graph.graph.node if n.op_type == "LayerNormalization" for a in n.attribute if a.name == "epsilon"
    ]
    heads = list(card.heads)
    config = BertConfig(
        **{k: int(geometry[k]) for k in GEOMETRY_KEYS},
        max_position_embeddings=int(geometry.get("max_position_embeddings", 512)),
        type_vocab_size=int(geometry.get("type_vocab_size", 2)),
        layer_norm_eps=float(epsilons[0]) if epsilons else 1e-12,
        num_labels=len(heads),
        problem_type="multi_label_classification",
        id2label=dict(enumerate(heads)),
        label2id={h: i for i, h in enumerate(heads)},
    )
    model = BertForSequenceClassification(config).eval()
    params = parameters_from_graph(graph)
    wanted = model.state_dict()
    absent = sorted(set(wanted) - set(params))
    if absent:
        raise ExportError(f"{model_dir}: the graph has no tensor for {absent[:5]}{' …' if len(absent) > 5 else ''}")
    for name, value in params.items():
        if name in wanted and tuple(wanted[name].shape) != value.shape:
            raise ExportError(
                f"{model_dir}: {name} is {value.shape} in the graph, {tuple(wanted[name].shape)} in the model"
            )
    model.load_state_dict({k: torch.tensor(params[k]) for k in wanted}, strict=True)
    _check_logits(model, model_dir, card, fp32)
    return save_checkpoint(out, model, Tokenizer.from_file(str(model_dir / TOKENIZER_FILE)), card)


def _check_logits(model: BertForSequenceClassification, model_dir: Path, card: ModelCard, fp32: Path) -> None:
    import onnxruntime as ort

    encoder = DialogueEncoder.from_file(model_dir / TOKENIZER_FILE, card.encoding_config)
    rows = [row for e in encoder.encode_batch(list(PROBES)) for row in (e, e.alone) if row is not None]
    feeds = pad_batch(rows, encoder.pad_id)
    session = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    expected = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    got, allowance = torch_reference(model, rows, encoder.pad_id)  # the export's rule: floor or fp32 order allowance
    diff = np.abs(got - expected)
    tolerance = float(card.export.get("tolerance") or DEFAULT_TOLERANCE)
    if not bool(np.all(diff <= np.maximum(tolerance, allowance))):
        raise ExportError(
            f"{model_dir}: the rebuilt model's logits differ from the fp32 graph's by {float(diff.max()):.3g} "
            f"(> {tolerance}, or the fp32 order allowance up to {float(allowance.max()):.3g})"
        )


def main(argv: list[str] | None = None) -> int:
    """``python -m dialogue_safety.export.weights_back MODEL_DIR OUT``: write the checkpoint rebuilt from MODEL_DIR's
    weights to OUT (e.g. to export the shipped model again: ``dialogue-safety export OUT MODEL_DIR ...``)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m dialogue_safety.export.weights_back", description=main.__doc__)
    parser.add_argument("model_dir", type=Path, help="an exported model directory (model.onnx, tokenizer.json, card)")
    parser.add_argument("out", type=Path, help="the checkpoint directory to write")
    args = parser.parse_args(argv)
    try:
        path = checkpoint_from_model_dir(args.model_dir, args.out)
    except (ExportError, FileNotFoundError, ValueError) as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} (the weights of {args.model_dir}, logits checked against its fp32 graph)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
