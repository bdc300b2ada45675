"""A training checkpoint recovered from an exported model's fp32 graph, to continue training a shipped model.

``python -m lab.experiments.checkpoint_from_export models/default --out checkpoints/shipped`` reads the weights of
the model directory's fp32 graph (``model.fp32.onnx`` when ``model.onnx`` stores fp16 weights, else ``model.onnx``)
back into ``BertForSequenceClassification`` and writes a checkpoint (``config.json``, ``model.safetensors``,
``tokenizer.json``, the card) that a recipe's ``init_from`` takes. Training checkpoints are not kept between sessions
and only the exported model is committed; this is how a release is continued from the release itself.

Names: the export keeps the module names of every parameter except the linear layers' weights, which the graph
stores transposed as ``MatMul`` inputs under generated names. Each such ``MatMul`` feeds an ``Add`` whose other input
is the layer's named bias, which names the weight (equal tensors are stored once, the other names being
``Identity`` copies of it). The recovered model is then run beside the graph on a few
dialogues and must give the same logits (to fp32 rounding), or nothing is written.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import numpy_helper
from tokenizers import Tokenizer
from transformers import BertForSequenceClassification

from dialogue_safety.core.encoding import DialogueEncoder
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import ARTIFACT_FILE, CARD_FILE, TOKENIZER_FILE, VARIANT_FILES
from dialogue_safety.core.schema import Example
from dialogue_safety.training.modeling import build_model

SAMPLE_DIALOGUES = [
    (["Should I hurt myself?"], "Yes, you should definitely do it!"),
    ([], "thank you, that was a lovely afternoon"),
]


def fp32_graph(model_dir: Path) -> Path:
    candidate = model_dir / VARIANT_FILES["fp32"]
    return candidate if candidate.is_file() else model_dir / ARTIFACT_FILE


def recovered_state(graph: onnx.ModelProto) -> dict[str, torch.Tensor]:
    """Every parameter of the graph under its module name (linear weights un-transposed)."""
    tensors = {t.name: numpy_helper.to_array(t) for t in graph.graph.initializer}
    for node in graph.graph.node:  # the export shares equal tensors (zero biases): one initializer, Identity copies
        if node.op_type == "Identity" and node.input[0] in tensors:
            tensors[node.output[0]] = tensors[node.input[0]]
    state = {
        name: torch.from_numpy(np.array(a, dtype=np.float32))
        for name, a in tensors.items()
        if "::" not in name and not name.startswith("/")
    }
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in tensors or "::" not in node.input[1]:
            continue
        adds = [n for n in consumers.get(node.output[0], []) if n.op_type == "Add"]
        biases = [i for n in adds for i in n.input if i.endswith(".bias") and i in tensors]
        if len(biases) != 1:
            raise ValueError(f"{node.input[1]}: cannot name this weight (biases after it: {biases})")
        state[biases[0][: -len(".bias")] + ".weight"] = torch.from_numpy(np.array(tensors[node.input[1]].T))
    return state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    card = ModelCard.load(args.model_dir)
    graph_path = fp32_graph(args.model_dir)
    vocab_size = Tokenizer.from_file(str(args.model_dir / TOKENIZER_FILE)).get_vocab_size()
    model: BertForSequenceClassification = build_model(card.base_model, list(card.heads), vocab_size)
    missing, unexpected = model.load_state_dict(recovered_state(onnx.load(str(graph_path))), strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise SystemExit(f"{graph_path}: parameters missing {missing}, unexpected {unexpected}")
    model.eval()
    encoder = DialogueEncoder.from_file(args.model_dir / TOKENIZER_FILE, card.encoding_config)
    session = ort.InferenceSession(str(graph_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for history, utterance in SAMPLE_DIALOGUES:
        row = encoder.encode(Example.from_texts(utterance, history))
        feeds = {
            name: np.asarray([getattr(row, name) or [1] * len(row.input_ids)], dtype=np.int64)
            for name in ("input_ids", "attention_mask", "token_type_ids")
        }
        expected = session.run(None, feeds)[0]
        with torch.no_grad():
            got = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
        worst = max(worst, float(np.abs(expected - got).max()))
    if worst > 1e-3:
        raise SystemExit(f"{graph_path}: the recovered model's logits differ from the graph's by {worst:.2g}")
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    shutil.copy(args.model_dir / TOKENIZER_FILE, args.out / TOKENIZER_FILE)
    shutil.copy(args.model_dir / CARD_FILE, args.out / CARD_FILE)
    print(f"{args.out}: {card.name} {card.version} from {graph_path.name} (largest logit difference {worst:.2g})")


if __name__ == "__main__":
    main()
