"""The run directory: what a training run keeps beside its checkpoint while it runs.

Layout of ``OUT`` during a run (the finished checkpoint's files are ``dialogue_safety.training.checkpoint``'s)::

    metrics.jsonl          the run's events, one JSON object a line (start, train, valid, eval, done), every leg
    last/                  the resumable state: the model's weights (Hugging Face) and training_state.pt
                           (optimizer, schedule, torch RNG, the loop's position, the best check, the weight average)
    best_model.pt          the weights of the best validation check so far (``keep_best``)

``last/`` and ``best_model.pt`` are removed once the run finishes; ``metrics.jsonl`` stays (the curve reads it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "training_state.pt"
BEST_FILE = "best_model.pt"
LAST_DIR = "last"
METRICS_FILE = "metrics.jsonl"


def log_event(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


def save_state(
    out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, state: dict[str, Any]
) -> None:
    """Write ``out/last`` (weights, optimizer, schedule, RNG and ``state``) whole or not at all."""
    tmp = out / (LAST_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[operator]
    torch.save(
        {
            **state,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        },
        tmp / STATE_FILE,
    )
    final = out / LAST_DIR
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def has_state(last: Path) -> bool:
    """Whether ``last`` holds a resumable state."""
    return (last / STATE_FILE).is_file()


def restore_state(last: Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Load the optimizer, schedule and torch RNG saved in ``last``; return the rest of the saved state
    (the loop's position, the best check, the weight average). Call it after building the scheduler:
    building it rewrites the learning rates the optimizer state restores."""
    state: dict[str, Any] = torch.load(last / STATE_FILE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    return state
