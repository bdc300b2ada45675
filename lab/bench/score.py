"""``python -m lab.bench score``: corpus scoring throughput and memory, engines side by side.

On the same rows (DiaSafety + ConvAbuse test dialogues, repeated up to ``--rows``; synthetic
dialogues when the data is missing), written once as a JSONL file:

* **runtime**: the in-process ``OnnxClassifier.predict`` on the rows in chunks of
  ``--chunk-size`` (already parsed, nothing read or written): the reference;
* **local**: ``dialogue-safety score`` (:func:`dialogue_safety.corpus.job.run_local`) on the file, same
  classifier (model loading excluded), reading, validating, writing parts and merging included;
* **ray**: ``--engine ray`` on a local Ray with ``--ray-cpus`` CPUs, ``actors x threads``
  (default 2 x 1): the whole job (Ray start, model shipping, actor start included), and the
  same job on 20 rows, whose time is the fixed cost subtracted for a scoring-rate estimate;
* **explain**: the cost of ``--explain`` on the same engine (occlusion: one extra sequence per word).

Scaling efficiency = engine rows/s ÷ runtime rows/s (targets: local ≥ 0.90, Ray ≥ 0.75).
Runtime and local alternate ``--repeats`` times and the best pass of each is reported (the
machine may be shared). Peak RSS: the local engine in a fresh process (``os.wait4``'s
``ru_maxrss``) on synthetic files of two sizes (``--rss-rows``, short comments so it stays
quick): bounded memory means the two peaks are about equal. Prints JSON and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import Example
from dialogue_safety.corpus.job import DEFAULT_CHUNK_SIZE, ScoreJob, run_local
from lab.bench.dialogues import load_dialogues
from lab.bench.emit import emit_report

TARGET_LOCAL = 0.90
TARGET_RAY = 0.75


def write_rows(path: Path, examples: Sequence[Example]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, e in enumerate(examples):
            f.write(json.dumps({"id": i, "utterance": e.utterance, "history": [t.text for t in e.history]}) + "\n")
    return path


def repeat_to(examples: list[Example], n: int) -> list[Example]:
    return [examples[i % len(examples)] for i in range(n)]


def time_runtime(clf: Any, examples: Sequence[Example], chunk: int) -> float:
    started = time.perf_counter()
    for i in range(0, len(examples), chunk):
        clf.predict(examples[i : i + chunk])
    return time.perf_counter() - started


def peak_rss_mib(input_path: Path, output: Path, model: Path | None, variant: str | None, chunk: int) -> float:
    """Peak RSS of ``dialogue-safety score`` on ``input_path`` in a fresh process (MiB)."""
    argv = [
        sys.executable,
        "-m",
        "dialogue_safety.cli.score",
        str(input_path),
        str(output),
        "--no-progress",
        "--restart",
    ]
    argv += ["--chunk-size", str(chunk)]
    if model:
        argv += ["--model", str(model)]
    if variant:
        argv += ["--variant", variant]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"the scoring process failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return usage.ru_maxrss / 1024.0  # KiB on Linux


def run(args: argparse.Namespace, say: Any) -> dict[str, Any]:
    from dialogue_safety.core.model_dir import default_model_dir
    from dialogue_safety.core.runtime import OnnxClassifier

    model = args.model or default_model_dir()
    clf = OnnxClassifier(model, variant=args.variant)
    clf.warmup()
    dialogues, note = load_dialogues(args.data_dir, args.rows)
    rows = repeat_to(dialogues, args.rows)
    report: dict[str, Any] = {
        "benchmark": "score",
        "model": clf.model_id,
        "variant": clf.variant,
        "threads": clf.intra_op_threads,
        "rows": len(rows),
        "distinct_dialogues": len(dialogues),
        "data": note,
        "chunk_size": args.chunk_size,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_1m": os.getloadavg()[0]},
    }
    work = Path(tempfile.mkdtemp(prefix="bench-score-", dir=args.work_dir))
    corpus = write_rows(work / "rows.jsonl", rows)
    runtime_s: list[float] = []
    local_s: list[float] = []
    for r in range(args.repeats):
        say(f"pass {r + 1}/{args.repeats}: runtime")
        runtime_s.append(time_runtime(clf, rows, args.chunk_size))
        say(f"pass {r + 1}/{args.repeats}: local engine")
        job = ScoreJob(corpus, work / "local.jsonl", model_dir=model, variant=args.variant, chunk_size=args.chunk_size)
        local_s.append(run_local(job, classifier=clf, progress=False, restart=True).seconds)
    best_runtime, best_local = len(rows) / min(runtime_s), len(rows) / min(local_s)
    engines: list[dict[str, Any]] = [
        {
            "key": "runtime",
            "engine": "runtime (in-process predict)",
            "rows_per_s": best_runtime,
            "seconds": runtime_s,
            "efficiency": 1.0,
        },
        {
            "key": "local",
            "engine": "local (dialogue-safety score)",
            "rows_per_s": best_local,
            "seconds": local_s,
            "efficiency": best_local / best_runtime,
        },
    ]
    if args.explain_rows:
        say("local engine with --explain")
        sub = write_rows(work / "explain.jsonl", rows[: args.explain_rows])
        job = ScoreJob(
            sub,
            work / "explain.jsonl.out.jsonl",
            model_dir=model,
            variant=args.variant,
            chunk_size=args.chunk_size,
            explain=True,
        )
        s = run_local(job, classifier=clf, progress=False, restart=True).seconds
        plain_s = time_runtime(clf, rows[: args.explain_rows], args.chunk_size)
        words = sum(len(e.utterance.split()) for e in rows[: args.explain_rows]) / args.explain_rows
        engines.append(
            {
                "key": "explain",
                "engine": "local --explain",
                "rows_per_s": args.explain_rows / s,
                "seconds": [s],
                "efficiency": args.explain_rows / s / best_runtime,
                "note": f"{words:.1f} words per utterance; runtime on these rows "
                f"{args.explain_rows / plain_s:.1f} rows/s",
            }
        )
    if args.explain_singles:
        say(f"explain latency on {args.explain_singles} single requests")
        report["explain_latency"] = explain_latency(clf, rows[: args.explain_singles])
    if not args.no_ray:
        say(f"ray engine ({args.ray_cpus} CPUs)")
        engines.append(bench_ray(corpus, work, model, args, best_runtime))
    report["engines"] = engines
    if args.rss_rows:
        report["peak_rss"] = []
        for n in args.rss_rows:
            say(f"peak RSS on {n:,} synthetic rows")
            path = write_short_comments(work / f"rss-{n}.jsonl", n)
            started = time.perf_counter()
            mib = peak_rss_mib(path, work / f"rss-{n}.out.jsonl", args.model, args.variant, args.chunk_size)
            report["peak_rss"].append(
                {
                    "rows": n,
                    "file_mib": path.stat().st_size / 2**20,
                    "peak_rss_mib": mib,
                    "seconds": time.perf_counter() - started,
                }
            )
    report["targets"] = targets(report)
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return report


def explain_latency(clf: Any, examples: Sequence[Example]) -> dict[str, Any]:
    """p50/p90 latency of one request with and without ``explain``, in-process, by utterance words."""
    from dialogue_safety.core.explain import explain

    plain, explained = [], []
    for e in examples:
        started = time.perf_counter()
        clf.predict([e])
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        explain(clf, [e])
        explained.append(time.perf_counter() - started)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    words = sorted(len(e.utterance.split()) for e in examples)
    return {
        "requests": len(examples),
        "words_p50": words[len(words) // 2],
        "plain_p50_ms": pct(plain, 0.5),
        "plain_p90_ms": pct(plain, 0.9),
        "explain_p50_ms": pct(explained, 0.5),
        "explain_p90_ms": pct(explained, 0.9),
    }


def bench_ray(corpus: Path, work: Path, model: Path, args: argparse.Namespace, reference: float) -> dict[str, Any]:
    """The whole Ray job on the rows, and the same job on 20 rows: its fixed cost (Ray start, model
    shipping, actor start), so that the scoring rate can be estimated without it."""
    try:
        from dialogue_safety.corpus.ray_engine import RayOptions, run_ray
    except ImportError as exc:
        return {"key": "ray", "engine": "ray", "skipped": f"{exc}: pip install 'dialogue-safety[scale]'"}
    options = RayOptions(num_cpus=args.ray_cpus, actors=args.ray_actors, threads_per_actor=args.ray_threads)
    tiny_rows = work / "ray-tiny.jsonl"
    with open(corpus, encoding="utf-8") as src, open(tiny_rows, "w", encoding="utf-8") as dst:
        dst.writelines(line for _, line in zip(range(20), src, strict=False))
    kw: dict[str, Any] = {"model_dir": model, "variant": args.variant, "chunk_size": args.chunk_size}
    tiny = run_ray(ScoreJob(tiny_rows, work / "ray-tiny.out.jsonl", **kw), options, progress=False)
    s = run_ray(ScoreJob(corpus, work / "ray.jsonl", **kw), options, progress=False)
    net = s.seconds - tiny.seconds
    net_rate = (s.rows - tiny.rows) / net if net > 0 else 0.0
    return {
        "key": "ray",
        "engine": f"ray, {s.engine.removeprefix('ray ').strip('()')}, {args.ray_cpus} CPUs",
        "rows_per_s": s.rows / s.seconds,
        "seconds": [s.seconds],
        "fixed_cost_s": tiny.seconds,
        "rows_per_s_without_fixed_cost": net_rate,
        "efficiency": s.rows / s.seconds / reference,
        "efficiency_without_fixed_cost": net_rate / reference,
    }


def write_short_comments(path: Path, n: int, seed: int = 0) -> Path:
    """``n`` rows of 2-6-word comments, streamed to ``path`` (never held in memory)."""
    import random

    from lab.bench.dialogues import WORDS

    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))}))
            f.write("\n")
    return path


def targets(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    engines = {e["key"]: e for e in report["engines"]}
    if "local" in engines:
        eff = engines["local"]["efficiency"]
        out["local_vs_runtime"] = {"target": TARGET_LOCAL, "measured": round(eff, 3), "met": eff >= TARGET_LOCAL}
    if "ray" in engines and "efficiency" in engines["ray"]:
        eff, steady = engines["ray"]["efficiency"], engines["ray"]["efficiency_without_fixed_cost"]
        out["ray_vs_runtime"] = {
            "target": TARGET_RAY,
            "measured": round(eff, 3),
            "measured_without_fixed_cost": round(steady, 3),
            "met": eff >= TARGET_RAY,
        }
    rss = report.get("peak_rss", [])
    if len(rss) >= 2:
        small, large = rss[0], rss[-1]
        growth = large["peak_rss_mib"] / small["peak_rss_mib"]
        out["peak_rss_independent_of_size"] = {
            "rows": [small["rows"], large["rows"]],
            "peak_rss_mib": [round(small["peak_rss_mib"], 1), round(large["peak_rss_mib"], 1)],
            "ratio": round(growth, 3),
            "met": growth < 1.10,
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"### Corpus scoring: {report['rows']:,} rows ({report['data']}), model {report['model']} "
        f"({report['variant']}), chunk {report['chunk_size']}",
        "",
        "| engine | rows/s | efficiency vs runtime | seconds |",
        "|---|---:|---:|---|",
    ]
    for e in report["engines"]:
        if "skipped" in e:
            lines.append(f"| {e['engine']} | skipped: {e['skipped']} | | |")
            continue
        secs = ", ".join(f"{s:.1f}" for s in e["seconds"])
        extra = ""
        if "fixed_cost_s" in e:
            extra = f" (a 20-row job takes {e['fixed_cost_s']:.0f} s; without that fixed cost "
            extra += f"{e['rows_per_s_without_fixed_cost']:.0f} rows/s = {e['efficiency_without_fixed_cost']:.2f})"
        lines.append(f"| {e['engine']} | {e['rows_per_s']:.0f} | {e['efficiency']:.2f}{extra} | {secs} |")
    lat = report.get("explain_latency")
    if lat:
        lines += [
            "",
            f"| one request ({lat['requests']} requests, median {lat['words_p50']} words) | p50 ms | p90 ms |",
            "|---|---:|---:|",
            f"| without explain | {lat['plain_p50_ms']:.1f} | {lat['plain_p90_ms']:.1f} |",
            f"| with explain | {lat['explain_p50_ms']:.1f} | {lat['explain_p90_ms']:.1f} |",
        ]
    if report.get("peak_rss"):
        lines += ["", "| synthetic rows | file MiB | peak RSS MiB | seconds |", "|---:|---:|---:|---:|"]
        for r in report["peak_rss"]:
            lines.append(f"| {r['rows']:,} | {r['file_mib']:.1f} | {r['peak_rss_mib']:.0f} | {r['seconds']:.0f} |")
    if report.get("targets"):
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        for name, t in report["targets"].items():
            measured = t.get("measured", t.get("ratio"))
            lines.append(f"| {name} | {measured} | {'yes' if t['met'] else 'no'} |")
    return "\n".join(lines)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the bundled model)")
    p.add_argument("--variant", default=None, help="ONNX variant (default: the card's CPU variant)")
    p.add_argument("--data-dir", default=None, help="data directory with the DiaSafety and ConvAbuse test splits")
    p.add_argument("--rows", type=int, default=4000, help="rows scored by every engine")
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="rows per chunk")
    p.add_argument("--repeats", type=int, default=2, help="alternating runtime/local passes (best reported)")
    p.add_argument("--explain-rows", type=int, default=200, help="rows scored with --explain (0: skip)")
    p.add_argument("--explain-singles", type=int, default=50, help="single requests timed with/without explain")
    p.add_argument("--no-ray", action="store_true", help="skip the Ray engine")
    p.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray")
    p.add_argument("--ray-actors", type=int, default=None, help="Ray actors (default: CPUs / threads)")
    p.add_argument("--ray-threads", type=int, default=1, help="onnxruntime threads per Ray actor")
    p.add_argument("--rss-rows", default="20000,80000", help="two synthetic file sizes for peak RSS ('' = skip)")
    p.add_argument("--work-dir", type=Path, default=None, help="where the temporary files go")
    p.add_argument("--keep", action="store_true", help="keep the temporary files")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench score") -> int:
    args = build_parser(prog).parse_args(argv)
    args.rss_rows = [int(x) for x in args.rss_rows.split(",") if x.strip()]
    if args.rows < 1 or args.chunk_size < 1 or args.repeats < 1:
        print(f"{prog}: --rows, --chunk-size and --repeats must be >= 1", file=sys.stderr)
        return 2

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"[bench score] {msg}", file=sys.stderr, flush=True)

    try:
        report = run(args, say)
    except Exception as exc:  # a benchmark that cannot run says why
        print(f"{prog}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    emit_report(report, markdown(report), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
