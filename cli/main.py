"""``dialogue-safety <command> ...``: one entry point, each command owned by its package.

Commands are imported lazily so that ``serve`` never imports torch and ``--help`` is fast.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("training.sources.cli", "inspect the datasets in a data directory"),
    "train": ("training.cli", "train a model from a recipe"),
    "export": ("export.cli", "export a checkpoint to an ONNX model directory"),
    "serve": ("service.cli", "run the HTTP service"),
    "evaluate": ("benchmarks.evaluate", "robustness evaluation report for a model"),
    "bench": ("benchmarks.cli", "speed benchmarks (runtime, http)"),
}


def usage() -> str:
    lines = ["usage: dialogue-safety <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "run 'dialogue-safety <command> --help' for a command's options"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"dialogue-safety: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    result: int = module.main(rest, prog=f"dialogue-safety {name}")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
