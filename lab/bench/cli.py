"""``python -m lab.bench <runtime|http|abuse|explain|score|language|conversation|door> ...``: each benchmark owned by
its module."""

from __future__ import annotations

from collections.abc import Sequence

from dialogue_safety.cli.dispatch import OWN_PACKAGES, dispatch

BENCHMARKS: dict[str, tuple[str, str]] = {
    "runtime": (
        "lab.bench.runtime_speed",
        "OnnxClassifier/torch speed: latency, throughput, batch x length sweep",
    ),
    "http": (
        "lab.bench.http",
        "the HTTP service under load (micro-batching, overload, naive baseline)",
    ),
    "abuse": (
        "lab.bench.abuse",
        "hostile clients against a local server: idle, slow, largest, overload...",
    ),
    "explain": (
        "lab.bench.explain_speed",
        "explanation latency (Shapley and leave-one-out) for 5, 40 and 168 words",
    ),
    "score": (
        "lab.bench.score",
        "corpus scoring: local engine and Ray vs the runtime, peak RSS by file size",
    ),
    "language": (
        "lab.bench.language",
        "the language check: cost and accuracy on short English, French and Italian texts",
    ),
    "conversation": (
        "lab.bench.conversation",
        "every turn of a 20-turn conversation in one call against one /v1/classify call per turn",
    ),
    "door": (
        "lab.bench.door",
        "the dialogue_safety/ files one request of each endpoint crosses on its way to the model",
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
    "conversation": "serve",
    "door": "serve",
}


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench") -> int:
    return dispatch(BENCHMARKS, argv, prog, kind="benchmark", extras=EXTRAS, own_packages=OWN_PACKAGES | {"lab"})


if __name__ == "__main__":
    raise SystemExit(main())
