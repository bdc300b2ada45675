"""``dialogue-safety <command> ...``: one entry point, each command owned by its package.

Commands are imported lazily so that ``serve`` never imports torch and ``--help`` is fast.
"""

from __future__ import annotations

from collections.abc import Sequence

from dialogue_safety.cli.dispatch import dispatch

COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("dialogue_safety.sources.cli", "inspect the datasets in a data directory"),
    "train": ("dialogue_safety.training.cli", "train a model from a recipe"),
    "export": ("dialogue_safety.export.cli", "export a checkpoint to an ONNX model directory"),
    "serve": ("dialogue_safety.service.cli", "run the HTTP service"),
    "evaluate": ("dialogue_safety.evaluation.evaluate", "robustness evaluation report for a model"),
    "score": ("dialogue_safety.cli.score", "score a JSONL/CSV/Parquet corpus file, locally or on Ray"),
    "break-it": (
        "dialogue_safety.cli.breakit",
        "break-it game rounds: open a round, add contexts, export validated attacks",
    ),
    "fix-it": (
        "dialogue_safety.cli.fix_it",
        "train A(N) on the recipe plus the validated break-it rounds; models x rounds report",
    ),
}
#: the pyproject.toml extra each command needs (checked before its module is imported)
EXTRAS: dict[str, str] = {
    "train": "train",
    "export": "train",
    "serve": "serve",
    "evaluate": "evaluate",
    "score": "serve",
    "break-it": "breakit",
    "fix-it": "train",
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(COMMANDS, argv, extras=EXTRAS)


if __name__ == "__main__":
    raise SystemExit(main())
