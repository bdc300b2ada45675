"""``dialogue-safety <command> ...``: one entry point, each command owned by its package.

Commands are imported lazily so that ``serve`` never imports torch and ``--help`` is fast.
"""

from __future__ import annotations

from collections.abc import Sequence

from cli.dispatch import dispatch

COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("training.sources.cli", "inspect the datasets in a data directory"),
    "train": ("training.cli", "train a model from a recipe"),
    "export": ("export.cli", "export a checkpoint to an ONNX model directory"),
    "serve": ("service.cli", "run the HTTP service"),
    "evaluate": ("evaluation.evaluate", "robustness evaluation report for a model"),
    "score": ("corpus.cli", "score a JSONL/CSV/Parquet corpus file, locally or on Ray"),
    "break-it": ("cli.breakit", "break-it game rounds: open a round, add contexts, export validated attacks"),
    "fix-it": (
        "training.fix_it",
        "train A(N) on the recipe plus the validated break-it rounds; models x rounds report",
    ),
    "bench": ("cli.bench", "speed benchmarks (runtime, http, abuse, score)"),
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
