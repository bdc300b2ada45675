"""The lab's checkpoint recovered from an exported model: the same logits as the graph, and a checkpoint that
``init_from`` takes (the heads checked)."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import Example
from dialogue_safety.training.checkpoint import initial_weights, load_checkpoint
from lab.experiments.checkpoint_from_export import fp32_graph, main


def test_a_recovered_checkpoint_scores_as_the_exported_graph(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "recovered"
    main([str(tiny_model_dir), "--out", str(out)])
    card = ModelCard.load(tiny_model_dir)
    initial_weights(out, list(card.heads))  # what init_from reads: the heads must be the card's
    model, encoder, _ = load_checkpoint(out)
    row = encoder.encode(Example.from_texts("you are an idiot", ["hello there"]))
    feeds = {
        "input_ids": np.asarray([row.input_ids], dtype=np.int64),
        "token_type_ids": np.asarray([row.token_type_ids], dtype=np.int64),
        "attention_mask": np.ones((1, len(row.input_ids)), dtype=np.int64),
    }
    session = ort.InferenceSession(str(fp32_graph(tiny_model_dir)), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    (expected,) = session.run(None, {k: v for k, v in feeds.items() if k in wanted})
    with torch.no_grad():
        got = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_a_model_directory_without_a_graph_is_refused(tmp_path: Path) -> None:
    with pytest.raises((FileNotFoundError, SystemExit)):
        main([str(tmp_path), "--out", str(tmp_path / "out")])
