"""``dialogue-safety bench <runtime|http|abuse|explain|score|language> ...``: each benchmark owned by its module."""

from __future__ import annotations

from collections.abc import Sequence

from dialogue_safety.cli.dispatch import dispatch

BENCHMARKS: dict[str, tuple[str, str]] = {
    "runtime": (
        "dialogue_safety.benchmarks.runtime_speed",
        "OnnxClassifier/torch speed: latency, throughput, batch x length sweep",
    ),
    "http": (
        "dialogue_safety.benchmarks.http",
        "the HTTP service under load (micro-batching, overload, naive baseline)",
    ),
    "abuse": (
        "dialogue_safety.benchmarks.abuse",
        "hostile clients against a local server: idle, slow, largest, overload...",
    ),
    "explain": (
        "dialogue_safety.benchmarks.explain_speed",
        "explanation latency (Shapley and leave-one-out) for 5, 40 and 168 words",
    ),
    "score": (
        "dialogue_safety.benchmarks.score",
        "corpus scoring: local engine and Ray vs the runtime, peak RSS by file size",
    ),
    "language": (
        "dialogue_safety.benchmarks.language",
        "the language check: cost and accuracy on short English, French and Italian texts",
    ),
}
#: both benchmarks run an exported model: the evaluate extra (torch rows need the train extra too)
EXTRAS: dict[str, str] = {
    "runtime": "evaluate",
    "http": "evaluate",
    "abuse": "evaluate",
    "explain": "evaluate",
    "score": "scale",
    "language": "serve",
}


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety bench") -> int:
    return dispatch(BENCHMARKS, argv, prog, kind="benchmark", extras=EXTRAS)


if __name__ == "__main__":
    raise SystemExit(main())
