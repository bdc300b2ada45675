"""The weight average of a run (``recipe.average_decay``): what checks, keep-best and the saved model use."""

from __future__ import annotations

import copy
from typing import Any

import torch


class WeightAverage:
    """An exponential moving average of a model's trained weights (``recipe.average_decay``).

    Each update moves the average towards the current weights by ``max(1 - decay, 1 / updates)``: a plain
    running mean over the first ``1 / (1 - decay)`` updates (the start weighs no more than any early step), then
    exponential; the early steps still weigh ``decay ** (steps - 1 / (1 - decay))`` (0.37 at twice that many).
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.updates = 0
        self.model = copy.deepcopy(model).eval()
        pairs = [(a, p) for a, p in zip(self.model.parameters(), model.parameters(), strict=True) if p.requires_grad]
        self._averaged: list[torch.Tensor] = [a for a, _ in pairs]
        self._current: list[torch.Tensor] = [p for _, p in pairs]

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        torch._foreach_lerp_(self._averaged, self._current, max(1.0 - self.decay, 1.0 / self.updates))

    def state(self) -> dict[str, Any]:
        return {"weights": self.model.state_dict(), "updates": self.updates}

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["weights"])  # in place: the pairs above stay bound
        self.updates = state["updates"]
