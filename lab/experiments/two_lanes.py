"""Would a second inference lane bound a short request's wait behind a long one? (issue 53's first target)

``python -m lab.experiments.two_lanes --model models/default`` times, in one process and without HTTP, a short
dialogue scored again and again while a second thread scores the largest legal utterance (a 4,000-character
utterance after 32 turns of 4,000, ~18 rows) in batches of the service's token budget:

* ``quiet``: the short dialogue alone, one session with the service's threads;
* ``one lane``: both through one session of the service's threads, one call at a time (a lock), as the
  batcher's one inference thread serialises them: the short call waits for the in-flight batch;
* ``two lanes``: two sessions of one intra-op thread each, one per thread, no lock: the short call runs beside
  the long batch.

Prints JSON and a table (p50 / p99 of the short call, ms, and × quiet). A measurement of the design, not the
service: the design is the batcher's inference workers now (``SAFETY_INFERENCE_WORKERS``, docs/api.md), measured
through HTTP with ``python -m lab.bench abuse --attacks largest``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import numpy as np

from dialogue_safety.core.batch_budget import MAX_BATCH_TOKENS, token_budget_batches
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example
from lab.bench.abuse import TEXT_4K

SHORT = Example.from_texts("you are a lovely person, thank you", ["hello, how was your day?"])
LONG = Example.from_texts(TEXT_4K, [TEXT_4K] * 32)


def _short_latencies(
    clf: OnnxClassifier, seconds: float, lock: AbstractContextManager[object], stop: threading.Event
) -> list[float]:
    rows = list(clf.encode([SHORT])[0].model_rows)
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        with lock:
            clf.row_logits(rows)
        out.append((time.perf_counter() - start) * 1e3)
        time.sleep(0.005)  # a client's think time: arrivals at random phases of the long batches
    stop.set()
    return out


def _long_loop(
    clf: OnnxClassifier, lock: AbstractContextManager[object], stop: threading.Event, done: list[int]
) -> None:
    """Score the long utterance's rows in budget-sized calls until ``stop``; ``done``: tokens scored."""
    rows = list(clf.encode([LONG])[0].model_rows)
    calls = [idx.tolist() for idx in token_budget_batches([len(r) for r in rows], MAX_BATCH_TOKENS, 64)]
    while not stop.is_set():
        for call in calls:
            with lock:
                clf.row_logits([rows[i] for i in call])
            done.append(sum(len(rows[i]) for i in call))
            if stop.is_set():
                return


def _case(
    short: OnnxClassifier | None,
    long: OnnxClassifier | None,
    lock: Callable[[], AbstractContextManager[object]],
    seconds: float,
) -> tuple[list[float], float]:
    """(the short call's latencies in ms, the long request's tokens scored a second)."""
    stop = threading.Event()
    shared = lock()
    done: list[int] = []
    worker = None
    if long is not None:
        worker = threading.Thread(target=_long_loop, args=(long, shared, stop, done), daemon=True)
        worker.start()
        time.sleep(0.5)
    start = time.perf_counter()
    if short is not None:
        lat = _short_latencies(short, seconds, shared, stop)
    else:
        lat = []
        time.sleep(seconds)
        stop.set()
    if worker is not None:
        worker.join()
    return lat, sum(done) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/default"))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    served = OnnxClassifier(args.model)
    lanes = [OnnxClassifier(args.model, intra_op_threads=1) for _ in range(2)]
    served.row_logits(list(served.encode([SHORT])[0].model_rows))
    for lane in lanes:
        lane.row_logits(list(lane.encode([SHORT])[0].model_rows))

    cases = {
        "quiet": _case(served, None, nullcontext, args.seconds),
        "quiet, one thread": _case(lanes[0], None, nullcontext, args.seconds),
        "long alone (served threads)": _case(None, served, nullcontext, args.seconds),
        "long alone (one thread)": _case(None, lanes[1], nullcontext, args.seconds),
        "one lane (served threads)": _case(served, served, threading.Lock, args.seconds),
        "two lanes (one thread each)": _case(lanes[0], lanes[1], nullcontext, args.seconds),
    }
    quiet_p99 = float(np.percentile(cases["quiet"][0], 99))
    report = {
        name: {
            "n": len(lat),
            "p50_ms": round(float(np.percentile(lat, 50)), 2) if lat else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 2) if lat else None,
            "p99_x_quiet": round(float(np.percentile(lat, 99)) / quiet_p99, 2) if lat else None,
            "long_tokens_per_s": round(rate),
        }
        for name, (lat, rate) in cases.items()
    }
    print(json.dumps(report, indent=2))
    print("\n| case | n | short p50 ms | short p99 ms | p99 × quiet | long tokens/s |\n|---|---:|---:|---:|---:|---:|")
    for name, r in report.items():
        print(f"| {name} | {r['n']} | {r['p50_ms']} | {r['p99_ms']} | {r['p99_x_quiet']} | {r['long_tokens_per_s']} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
