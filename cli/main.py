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
    "break-it": ("cli.breakit", "break-it game rounds: open a round, add contexts, export validated attacks"),
    "fix-it": (
        "training.fix_it",
        "train A(N) on the recipe plus the validated break-it rounds; models x rounds report",
    ),
    "bench": ("benchmarks.cli", "speed benchmarks (runtime, http)"),
}


def usage(table: dict[str, tuple[str, str]] = COMMANDS, prog: str = "dialogue-safety", kind: str = "command") -> str:
    width = max(len(name) for name in table) + 2
    lines = [f"usage: {prog} <{kind}> [options]", "", f"{kind}s:"]
    lines += [f"  {name:<{width}} {help_}" for name, (_, help_) in table.items()]
    lines += ["", f"run '{prog} <{kind}> --help' for its options"]
    return "\n".join(lines)


def dispatch(
    table: dict[str, tuple[str, str]], argv: Sequence[str] | None, prog: str = "dialogue-safety", kind: str = "command"
) -> int:
    """Run ``table[name]``'s module ``main(rest, prog=...)``, imported only when it is asked for."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage(table, prog, kind))
        return 0
    name, rest = args[0], args[1:]
    if name not in table:
        print(f"{prog}: unknown {kind} {name!r}\n\n{usage(table, prog, kind)}", file=sys.stderr)
        return 2
    module = importlib.import_module(table[name][0])
    result: int = module.main(rest, prog=f"{prog} {name}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(COMMANDS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
