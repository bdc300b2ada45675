"""Torch inference on encoded examples: length-sorted batches under a token budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from service.encoding import EncodedExample, pad_batch
from service.runtime import token_budget_batches  # one owner of the batching rule


def num_labels(model: torch.nn.Module) -> int:
    """The number of heads of a Hugging Face classifier (its ``config.num_labels``)."""
    config: Any = getattr(model, "config")  # noqa: B009 - torch.nn.Module types attributes as Tensor | Module
    return int(config.num_labels)


@torch.inference_mode()
def predict_logits(
    model: torch.nn.Module, encoded: Sequence[EncodedExample], token_budget: int = 16384, pad_id: int = 0
) -> np.ndarray:
    """[n, heads] logits in the input order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n_heads = num_labels(model)
    out = np.zeros((len(encoded), n_heads), dtype=np.float32)
    lengths = [len(e) for e in encoded]
    for idx in token_budget_batches(lengths, token_budget, max_batch_size=256):
        batch = pad_batch([encoded[i] for i in idx], pad_id)
        tensors = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
        out[idx] = model(**tensors).logits.float().cpu().numpy()
    if was_training:
        model.train()
    return out
