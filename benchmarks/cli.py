"""``dialogue-safety bench <runtime|http> ...``: the speed benchmarks, each owned by its module."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

BENCHMARKS: dict[str, tuple[str, str]] = {
    "runtime": ("benchmarks.runtime", "OnnxClassifier/torch speed: latency, throughput, batch x length sweep"),
    "http": ("benchmarks.http", "the HTTP service under load (micro-batching, overload, naive baseline)"),
}


def usage(prog: str) -> str:
    lines = [f"usage: {prog} <benchmark> [options]", "", "benchmarks:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in BENCHMARKS.items()]
    lines += ["", f"run '{prog} <benchmark> --help' for its options"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety bench") -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(usage(prog))
        return 0
    name, rest = args[0], args[1:]
    if name not in BENCHMARKS:
        print(f"{prog}: unknown benchmark {name!r}\n\n{usage(prog)}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[name][0])
    result: int = module.main(rest, prog=f"{prog} {name}")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
