"""A checkpoint rebuilt from an exported model directory's weights: the same function, loud when it is not,
and what ``bench runtime --model`` starts its naive exports from when the checkpoint is gone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
import torch
from conftest import assert_fp32_parity

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example
from dialogue_safety.export.onnx_export import ExportError, export_checkpoint
from dialogue_safety.export.weights_back import checkpoint_from_model_dir, parameters_from_graph
from dialogue_safety.training.checkpoint import load_checkpoint
from lab.bench.cli import main as bench_main

DIALOGUES = [
    Example.from_texts("you are an idiot"),
    Example.from_texts("thanks, that was helpful", ["can you help me?", "sure, what is it?"]),
    Example.from_texts(" ".join(["blah"] * 150), ["context " * 40]),
]


@pytest.fixture(scope="module")
def distinct_checkpoint(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with every parameter made distinct (a fresh model's biases are all 0 and its LayerNorm
    weights all 1: a bias or LayerNorm read from the wrong place would go unnoticed)."""
    from tokenizers import Tokenizer

    from dialogue_safety.training.checkpoint import save_checkpoint

    model, _, card = load_checkpoint(tiny_checkpoint)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    tokenizer = Tokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    return save_checkpoint(tmp_path_factory.mktemp("distinct"), model, tokenizer, card)


@pytest.fixture(scope="module")
def shipped(distinct_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("weights_back") / "model"
    export_checkpoint(distinct_checkpoint, out, variant_names=["fp32"], ship=True)
    return out


def test_the_rebuilt_checkpoint_is_the_shipped_model(shipped: Path, distinct_checkpoint: Path, tmp_path: Path) -> None:
    rebuilt = checkpoint_from_model_dir(shipped, tmp_path / "ckpt")
    model, encoder, card = load_checkpoint(rebuilt)
    original, _, _ = load_checkpoint(distinct_checkpoint)
    assert card.model_id == ModelCard.load(shipped).model_id
    mine, theirs = model.state_dict(), original.state_dict()
    assert set(mine) == set(theirs)
    for name, value in theirs.items():  # shipped weights are the checkpoint's rounded to fp16
        assert torch.equal(mine[name], value.half().float()), name
    rows = [r for e in encoder.encode_batch(DIALOGUES) for r in (e, e.alone) if r is not None]
    clf = OnnxClassifier(shipped, variant="fp32")
    assert_fp32_parity(clf.run_batch(rows), model, rows, encoder.pad_id)


def test_a_graph_missing_a_weight_is_refused_by_name(shipped: Path, tmp_path: Path) -> None:
    broken = tmp_path / "model"
    shutil.copytree(shipped, broken)
    graph = onnx.load(str(broken / "model.fp32.onnx"))
    params = parameters_from_graph(graph)
    assert "bert.encoder.layer.1.intermediate.dense.weight" in params  # read through its MatMul, transposed
    for node in graph.graph.node:  # a renamed MatMul no longer says which module it belongs to
        if node.name.endswith("layer.1/intermediate/dense/MatMul"):
            node.name = "/somewhere/else/MatMul"
    onnx.save(graph, str(broken / "model.onnx"))
    (broken / "model.fp32.onnx").unlink()
    card = json.loads((broken / "model_card.json").read_text())
    card["export"].pop("artifact_sha256", None)
    (broken / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(ExportError, match=r"layer\.1\.intermediate\.dense\.weight"):
        checkpoint_from_model_dir(broken, tmp_path / "ckpt")


def test_a_card_without_geometry_is_refused(shipped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "model"
    shutil.copytree(shipped, broken)
    card = json.loads((broken / "model_card.json").read_text())
    del card["export"]["geometry"]
    (broken / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(ExportError, match="export.geometry"):
        checkpoint_from_model_dir(broken, tmp_path / "ckpt")
    from dialogue_safety.export.weights_back import main

    assert main([str(broken), str(tmp_path / "ckpt")]) == 2  # the command says why, no traceback
    assert "export.geometry" in capsys.readouterr().err
    assert main([str(shipped), str(tmp_path / "ckpt")]) == 0 and load_checkpoint(tmp_path / "ckpt")[2].model_id
    assert main([str(tmp_path / "absent"), str(tmp_path / "ckpt2")]) == 2


def test_bench_runtime_rebuilds_the_checkpoint_when_only_the_model_dir_is_there(shipped: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"  # the card's source checkpoint does not exist on this machine
    shutil.copytree(shipped, model_dir)
    card = json.loads((model_dir / "model_card.json").read_text())
    card["export"]["source_checkpoint"] = str(tmp_path / "gone")
    (model_dir / "model_card.json").write_text(json.dumps(card))
    out = tmp_path / "bench.json"
    argv = ["runtime", "--smoke", "--model", str(model_dir), "--variants", "naive-fp32,naive-int8,fp32", "-q"]
    assert bench_main([*argv, "--no-sweep", "--no-long", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {e["engine"] for e in report["engines"]} == {"naive-fp32", "naive-int8", "onnxruntime fp32"}
    assert any("rebuilt from the model directory" in n for n in report["notes"])
    assert "vs_naive-int8" in report["ratios"]


def test_bench_runtime_skips_the_naive_exports_with_the_reason_when_no_checkpoint_can_be_rebuilt(
    shipped: Path, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(shipped, model_dir)
    card = json.loads((model_dir / "model_card.json").read_text())
    card["export"]["source_checkpoint"] = str(tmp_path / "gone")
    del card["export"]["geometry"]
    (model_dir / "model_card.json").write_text(json.dumps(card))
    out = tmp_path / "bench.json"
    argv = ["runtime", "--smoke", "--model", str(model_dir), "--variants", "naive-fp32,fp32", "-q", "--no-sweep"]
    assert bench_main([*argv, "--no-long", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {e["engine"] for e in report["engines"]} == {"onnxruntime fp32"}
    assert any("no checkpoint could be rebuilt" in n and "export.geometry" in n for n in report["notes"])
