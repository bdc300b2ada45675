"""``python -m lab.bench explain``: explanation latency by utterance length and method.

For each word count (default 5, 40 and 168 words of a fixed offensive-ish paragraph, repeated),
each method (``shapley``, the default of the API, and ``occlusion``, leave one word out) explains
one utterance through :func:`dialogue_safety.core.explain.explain` on the runtime, ``--repeats``
times after one warm-up, and reports p50/p90 latency, the sequences and padded tokens it scored,
and the latency of classifying the utterance alone. Prints the JSON report and a markdown table;
``--json`` writes the JSON too. Absolute timings depend on the machine (and on what else runs on
it): compare the rows of one run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dialogue_safety.core.explain import METHODS, SHAPLEY_BUDGET, explain, plan
from dialogue_safety.core.model_dir import default_model_dir
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example
from lab.bench.emit import emit_report

PARAGRAPH = (
    "honestly I think you are a complete moron and your stupid ideas are garbage that nobody with half a "
    "brain would ever listen to so please just stop posting this nonsense and go away forever because you "
    "are ruining the whole thread for everyone else here ok"
)
TEXT = PARAGRAPH.split(" ")
DEFAULT_WORDS = (5, 40, 168)


def utterance(words: int) -> str:
    return " ".join((TEXT * (words // len(TEXT) + 1))[:words])


def _ms(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def run(model_dir: Path, variant: str | None, words: Sequence[int], repeats: int, budget: int) -> dict[str, Any]:
    clf = OnnxClassifier(model_dir, variant=variant)
    clf.warmup(1)
    rows = []
    for n in words:
        example = Example.from_texts(utterance(n))
        single = []
        for _ in range(repeats):
            started = time.perf_counter()
            clf.predict([example])
            single.append(time.perf_counter() - started)
        for method in METHODS:
            p = plan(example, method=method, budget=budget)
            sequences = p.examples()
            encoded = clf.encode(sequences)
            padded = sum(len(idx) * max(len(encoded[i]) for i in idx) for idx in clf.batches(encoded))
            explain(clf, [example], method=method, budget=budget)  # warm-up
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                explain(clf, [example], method=method, budget=budget)
                times.append(time.perf_counter() - started)
            rows.append(
                {
                    "words": n,
                    "method": method,
                    "sequences": len(sequences),
                    "padded_tokens": int(padded),
                    "p50_ms": _ms(times, 0.5),
                    "p90_ms": _ms(times, 0.9),
                    "classify_p50_ms": round(1000 * statistics.median(single), 2),
                }
            )
    return {
        "benchmark": "explain",
        "model": clf.model_id,
        "variant": clf.variant,
        "threads": clf.intra_op_threads,
        "shapley_budget": budget,
        "repeats": repeats,
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"explanations of one utterance, {report['model']} ({report['variant']}, {report['threads']} threads), "
        f"p50/p90 of {report['repeats']}",
        "",
        "| words | method | sequences | padded tokens | p50 ms | p90 ms | classify alone p50 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['words']} | {r['method']} | {r['sequences']} | {r['padded_tokens']} | {r['p50_ms']} | "
            f"{r['p90_ms']} | {r['classify_p50_ms']} |"
        )
    return "\n".join(lines)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the bundled model)")
    p.add_argument("--variant", default=None, help="ONNX variant (default: the card's)")
    p.add_argument("--words", default=",".join(map(str, DEFAULT_WORDS)), help="comma-separated word counts")
    p.add_argument("--repeats", type=int, default=11, help="timed explanations per row (after one warm-up)")
    p.add_argument("--budget", type=int, default=SHAPLEY_BUDGET, help="Shapley coalitions drawn beyond the singletons")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench explain") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        words = [int(w) for w in args.words.split(",") if w.strip()]
    except ValueError:
        build_parser(prog).error(f"--words must be comma-separated integers, got {args.words!r}")
    if not words or min(words) < 1 or args.repeats < 1 or args.budget < 2:
        build_parser(prog).error("--words must be >= 1, --repeats >= 1 and --budget >= 2")
    report = run(args.model or default_model_dir(), args.variant, words, args.repeats, args.budget)
    emit_report(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
