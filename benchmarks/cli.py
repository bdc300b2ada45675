"""``dialogue-safety bench <runtime|http|abuse> ...``: the speed benchmarks, each owned by its module."""

from __future__ import annotations

from collections.abc import Sequence

from cli.main import dispatch

BENCHMARKS: dict[str, tuple[str, str]] = {
    "runtime": ("benchmarks.runtime", "OnnxClassifier/torch speed: latency, throughput, batch x length sweep"),
    "http": ("benchmarks.http", "the HTTP service under load (micro-batching, overload, naive baseline)"),
    "abuse": ("benchmarks.abuse", "hostile clients against a local server: idle, slow, largest, overload..."),
}


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety bench") -> int:
    return dispatch(BENCHMARKS, argv, prog, kind="benchmark")


if __name__ == "__main__":
    raise SystemExit(main())
