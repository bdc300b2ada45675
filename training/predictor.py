"""``TorchClassifier``: predictions from a training checkpoint, same interface as the ONNX runtime."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from service.schema import Example, Prediction
from service.scoring import head_probabilities, main_scores, predictions_from_logits
from training.checkpoint import load_checkpoint
from training.inference import predict_logits


class TorchClassifier:
    def __init__(self, checkpoint_dir: str | Path, token_budget: int = 16384) -> None:
        self.model, self.encoder, self.card = load_checkpoint(checkpoint_dir)
        self.token_budget = token_budget
        self.model_id = self.card.model_id
        self.name = f"{self.model_id} (torch checkpoint)"

    @property
    def threshold(self) -> float:
        return self.card.threshold

    def logits(self, examples: Sequence[Example]) -> np.ndarray:
        if not examples:
            return np.zeros((0, len(self.card.heads)), dtype=np.float32)
        encoded = self.encoder.encode_batch(examples)
        with torch.inference_mode():
            return predict_logits(self.model, encoded, self.token_budget, self.encoder.pad_id)

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        logits = self.logits(examples)
        return main_scores(head_probabilities(logits, self.card), self.card) if len(logits) else np.zeros(0)

    def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]:
        return predictions_from_logits(self.logits(examples), self.card, threshold)
