"""Torch inference on encoded examples: length-sorted batches under a token budget."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from service.encoding import EncodedExample, pad_batch


def token_budget_batches(lengths: Sequence[int], token_budget: int, max_batch: int = 256) -> Iterator[np.ndarray]:
    """Indices sorted by length, cut so that batch size × longest ≤ token_budget."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    start = 0
    while start < order.size:
        end = start + 1
        while end < order.size and end - start < max_batch and (end - start + 1) * lengths[order[end]] <= token_budget:
            end += 1
        yield order[start:end]
        start = end


@torch.inference_mode()
def predict_logits(
    model: torch.nn.Module, encoded: Sequence[EncodedExample], token_budget: int = 16384, pad_id: int = 0
) -> np.ndarray:
    """[n, heads] logits in the input order."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n_heads = int(model.config.num_labels)
    out = np.zeros((len(encoded), n_heads), dtype=np.float32)
    lengths = [len(e) for e in encoded]
    for idx in token_budget_batches(lengths, token_budget):
        batch = pad_batch([encoded[i] for i in idx], pad_id)
        tensors = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
        out[idx] = model(**tensors).logits.float().cpu().numpy()
    if was_training:
        model.train()
    return out
