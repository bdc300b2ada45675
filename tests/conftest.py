"""Shared hermetic fixtures: a tiny tokenizer from a local vocab, a tiny random BERT checkpoint,
and the real data directory (a missing dataset fails in CI and skips elsewhere)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
TINY_VOCAB = FIXTURES / "tiny_vocab.txt"
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def make_tiny_tokenizer() -> Tokenizer:
    from dialogue_safety.core.encoding import wordpiece_tokenizer

    return wordpiece_tokenizer(TINY_VOCAB)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer BERT checkpoint with one head, saved like a trained one."""
    import torch

    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.training.checkpoint import save_checkpoint
    from dialogue_safety.training.modeling import build_model

    torch.manual_seed(0)
    tok = make_tiny_tokenizer()
    model = build_model("random:tiny", ["offensive"], vocab_size=tok.get_vocab_size())
    card = ModelCard(name="tiny-random", version="0.0.1", base_model="random:tiny", threshold=0.5)
    return save_checkpoint(tmp_path_factory.mktemp("tiny_ckpt"), model, tok, card)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    from dialogue_safety.sources.data_dir import resolve_data_dir

    try:
        return resolve_data_dir()
    except FileNotFoundError as exc:
        if IN_CI:
            pytest.fail(f"CI needs the datasets: {exc}")
        pytest.skip(f"datasets not available: {exc}")


def require(path: Path) -> Path:
    """Return ``path`` if it exists; fail in CI, skip elsewhere."""
    if path.exists():
        return path
    if IN_CI:
        pytest.fail(f"CI needs {path}")
    pytest.skip(f"{path} not available")


def assert_fp32_parity(onnx_logits: Any, model: Any, rows: Sequence[Any], pad_id: int) -> None:
    """onnxruntime's logits for ``rows`` match torch's within the export's fp32 order allowance: two
    correct fp32 kernels sum in different orders (torch's, onnxruntime's MLAS with or without
    AVX-512/VNNI), so the allowed difference is relative to the head's term magnitude and the model's
    depth and widths (``dialogue_safety.export.onnx_export.torch_reference``), not a fixed constant."""
    import numpy as np

    from dialogue_safety.export.onnx_export import torch_reference

    reference, allowance = torch_reference(model, list(rows), pad_id)
    diff = np.abs(np.asarray(onnx_logits, dtype=np.float32) - reference)
    assert diff.shape == allowance.shape
    worst = np.unravel_index(int(np.argmax(diff / allowance)), diff.shape)
    assert bool(np.all(diff <= allowance)), (
        f"logit {worst}: |onnx - torch| {diff[worst]:.3g} > fp32 order allowance {allowance[worst]:.3g}"
    )
