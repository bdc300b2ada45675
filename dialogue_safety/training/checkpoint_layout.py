"""What a training checkpoint directory holds, checkable without importing torch.

``dialogue_safety.training.checkpoint`` writes and reads checkpoints (and imports transformers); commands that
only need to know whether a path *is* one (``export``, ``evaluate``, the benchmarks) ask here
first, so a wrong path fails in milliseconds with what to do instead of after minutes of work.
"""

from __future__ import annotations

from pathlib import Path

from dialogue_safety.core.model_dir import CHECKPOINT_FILES, is_checkpoint

#: how to get a checkpoint when there is none (checkpoints are never committed)
TRAIN_HINT = (
    "checkpoints are not shipped: train one with `dialogue-safety train --config default --out checkpoints/default` "
    "(~2 h on 2 cores, resumable with --resume), or try the tiny recipe in seconds: "
    "`dialogue-safety train --config tiny --data-dir tests/fixtures/sources/full --out runs/tiny`"
)


def checkpoint_problem(path: str | Path) -> str | None:
    """One line saying why ``path`` is not a training checkpoint (with what to do), or None if it is one."""
    directory = Path(path)
    if not directory.is_dir():
        return f"no checkpoint at {directory}; {TRAIN_HINT}"
    if not is_checkpoint(directory):
        missing = [f for f in CHECKPOINT_FILES if not (directory / f).is_file()]
        return f"{directory} is not a training checkpoint (no {', '.join(missing)}); {TRAIN_HINT}"
    return None
