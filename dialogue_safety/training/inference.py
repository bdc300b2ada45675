"""Torch inference on a training checkpoint: logits of encoded examples, and ``TorchClassifier``.

``predict_logits`` runs a Hugging Face classifier on encoded examples in length-sorted batches
under the one batching budget (:mod:`dialogue_safety.core.batch_budget`); ``TorchClassifier`` puts a
checkpoint behind the ONNX runtime's interface (``predict``, ``predict_proba``) for evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dialogue_safety.core.batch_budget import MAX_BATCH_SIZE, MAX_BATCH_TOKENS, token_budget_batches
from dialogue_safety.core.encoding import EncodedExample, pad_batch
from dialogue_safety.core.limits import MAX_WINDOWS
from dialogue_safety.core.schema import Example, Prediction
from dialogue_safety.core.scoring import (
    context_columns,
    decomposed_logits,
    head_probabilities,
    main_scores,
    predictions_from_logits,
)
from dialogue_safety.training.checkpoint import load_checkpoint


def num_labels(model: torch.nn.Module) -> int:
    """The number of heads of a Hugging Face classifier (its ``config.num_labels``)."""
    config: Any = getattr(model, "config")  # noqa: B009 - torch.nn.Module types attributes as Tensor | Module
    return int(config.num_labels)


@torch.inference_mode()
def predict_logits(
    model: torch.nn.Module,
    encoded: Sequence[EncodedExample],
    max_batch_tokens: int = MAX_BATCH_TOKENS,
    pad_id: int = 0,
    context_cols: Sequence[int] = (),
) -> np.ndarray:
    """[n, heads] logits in the input order; with ``context_cols`` (a decomposed card) each head is
    read from its own row (:func:`dialogue_safety.core.scoring.decomposed_logits`)."""
    return decomposed_logits(
        encoded, lambda rows: _row_logits(model, rows, max_batch_tokens, pad_id), list(context_cols)
    )


def _row_logits(
    model: torch.nn.Module, encoded: Sequence[EncodedExample], max_batch_tokens: int, pad_id: int
) -> np.ndarray:
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n_heads = num_labels(model)
    out = np.zeros((len(encoded), n_heads), dtype=np.float32)
    lengths = [len(e) for e in encoded]  # rows: each window of a long utterance is one
    for idx in token_budget_batches(lengths, max_batch_tokens, MAX_BATCH_SIZE):
        batch = pad_batch([encoded[i] for i in idx], pad_id)
        tensors = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
        out[idx] = model(**tensors).logits.float().cpu().numpy()
    if was_training:
        model.train()
    return out


class TorchClassifier:
    """Predictions from a training checkpoint, same interface as the ONNX runtime."""

    def __init__(
        self,
        checkpoint_dir: str | Path,
        max_batch_tokens: int = MAX_BATCH_TOKENS,
        max_windows: int | None = MAX_WINDOWS,
    ) -> None:
        self.model, self.encoder, self.card = load_checkpoint(checkpoint_dir)
        self.max_batch_tokens = max_batch_tokens
        self.max_windows = max_windows  # windows over a long utterance, as the ONNX runtime reads it
        self.model_id = self.card.model_id
        self.name = f"{self.model_id} (torch checkpoint)"

    @property
    def threshold(self) -> float:
        return self.card.threshold

    def logits(self, examples: Sequence[Example]) -> np.ndarray:
        return self._logits(self.encoder.encode_batch(examples, self.max_windows) if examples else [])

    def _logits(self, encoded: Sequence[EncodedExample]) -> np.ndarray:
        if not encoded:
            return np.zeros((0, len(self.card.heads)), dtype=np.float32)
        with torch.inference_mode():
            return predict_logits(
                self.model, encoded, self.max_batch_tokens, self.encoder.pad_id, context_columns(self.card)
            )

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        logits = self.logits(examples)
        return main_scores(head_probabilities(logits, self.card), self.card) if len(logits) else np.zeros(0)

    def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]:
        encoded = self.encoder.encode_batch(examples, self.max_windows) if examples else []
        return predictions_from_logits(self._logits(encoded), self.card, threshold, [e.read for e in encoded])
