"""``python -m lab.bench http``: the HTTP service under load, next to the runtime and a naive service.

What it does, in one run (all traffic to 127.0.0.1, every loop bounded in time and count):

1. **runtime reference** (in this process): ``OnnxClassifier`` p50 of one-example ``predict`` (back to back,
   and after a ``PACED_GAP_S`` idle pause: what a c=1 client's round trip leaves between calls) and batched
   throughput (batches of ``--runtime-batch``);
2. **service** (``dialogue-safety serve`` in a subprocess, one uvicorn worker): a closed-loop
   load generator (a raw keep-alive client, or ``httpx.AsyncClient``) at each ``--concurrency``
   for ``--duration`` seconds, and with c=1 the **HTTP floor** (``GET /health`` at c=1 through the same
   server and client: what any answer costs). Steps 1 and 2 run in turns, ``--rounds`` times (the server idles
   while the runtime runs, and the other way round), and each target compares the two sides of
   one round, reported as the median over the rounds: a shared machine drifts by tens of per cent
   within minutes. Then batch requests (``/v1/classify/batch``). A client answered 429 waits the
   service's ``Retry-After`` before its next request, as a well-behaved client does (the overload
   phase below does not: it measures how fast refusals are);
3. **overload**: a second server with a small queue, hit with 4x the concurrency its queue
   and one batch can hold: 429s must come back fast, RSS must stay bounded, and a
   recovery phase afterwards must see no errors;
4. **naive** (``--naive-checkpoint DIR``): ``lab/bench/naive_service.py`` (transformers
   pipeline in torch, one request at a time) at ``--naive-concurrency``; the ratio is reported.

Prints JSON and a markdown table; ``--json PATH`` also writes the JSON. ``--smoke`` runs every
phase for a moment (the test suite uses it with a tiny model; no timing targets apply).
Data: the dialogue test splits (DiaSafety, ConvAbuse) via ``dialogue_safety.sources.registry``;
synthetic dialogues when they are not available (noted in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import TypeAdapter

from dialogue_safety.core.model_dir import default_model_dir, model_dir_problem
from dialogue_safety.core.schema import Example
from dialogue_safety.service.routes import HEALTH_PATH
from dialogue_safety.service.settings import ServiceSettings
from lab.bench.dialogues import load_dialogues  # one owner of the benchmark data
from lab.bench.emit import emit_report
from lab.bench.http_client import HOST
from lab.bench.http_report import FLOOR_PHASE, floors_by_round, markdown
from lab.bench.load_generator import (
    Phase,
    PhaseRecorder,
    closed_loop,
    loop_name,
    ms,
    percentile,
    request_body,
    run_async,
)
from lab.bench.local_server import (
    Server,
    free_port,
    mib,
    running_server,
    server_settings,
    service_cmd,
    service_env,
)

RETRY_AFTER_S = float(ServiceSettings.model_fields["retry_after_s"].default)  # what a 429 asks a client to wait
# the runtime reference does the service's work: with the language of each utterance when the service says it
PACED_GAP_S = 0.002  # the idle pause before each "after a gap" runtime single: about a c=1 client's round trip
LANGUAGE_CHECK = bool(ServiceSettings.model_fields["language_check"].default)

# -- data ---------------------------------------------------------------------------------------------


# -- measurements -------------------------------------------------------------------------------------


class RuntimeReference:
    """The in-process ``OnnxClassifier`` the service is compared with (same model, variant, batching
    budget and language check), loaded once and measured in each round (:func:`measure_in_turns`)."""

    def __init__(
        self, model_dir: Path, *, variant: str | None, max_batch_tokens: int, language_check: bool = LANGUAGE_CHECK
    ) -> None:
        from dialogue_safety.core.runtime import OnnxClassifier

        self.clf = OnnxClassifier(
            model_dir, variant=variant, max_batch_tokens=max_batch_tokens, language_check=language_check
        )
        self.clf.warmup()
        self.max_batch_tokens = max_batch_tokens

    def singles(
        self, examples: Sequence[Example], *, duration_s: float, first: int = 0, at_least: int = 5, gap_s: float = 0.0
    ) -> list[float]:
        """Seconds of one-example ``predict`` calls (encoding included) for ``duration_s``, from ``examples[first]``;
        ``gap_s``: an idle pause before each call (not timed), as a c=1 client's round trip leaves the server."""
        clf = self.clf
        out: list[float] = []
        deadline = time.perf_counter() + duration_s
        for i in range(first, first + 100_000):
            if time.perf_counter() > deadline and len(out) >= at_least:
                break
            if gap_s:
                time.sleep(gap_s)
            start = time.perf_counter()
            clf.predict([examples[i % len(examples)]])
            out.append(time.perf_counter() - start)
        return out

    def batched(self, examples: Sequence[Example], *, duration_s: float, batch: int) -> float:
        """Items/s of ``predict`` over consecutive chunks of ``batch`` examples (encoding included)."""
        items = 0
        started = time.perf_counter()
        deadline = started + duration_s
        for i in range(100_000):
            if time.perf_counter() > deadline and i >= 2:
                break
            chunk = [examples[(i * batch + j) % len(examples)] for j in range(batch)]
            self.clf.predict(chunk)
            items += len(chunk)
        return items / (time.perf_counter() - started)

    def report(
        self,
        singles: list[float],
        batched_items_per_s: float,
        *,
        batch: int,
        round_no: int,
        paced: Sequence[float] = (),
    ) -> dict[str, Any]:
        """One round's figures; ``paced``: single latencies measured after an idle gap (:data:`PACED_GAP_S`)."""
        clf = self.clf
        return {
            "round_no": round_no,
            "model": clf.model_id,
            "variant": clf.variant,
            "provider": clf.provider,
            "single_p50_ms": ms(percentile(singles, 50)),
            "single_p99_ms": ms(percentile(singles, 99)),
            "single_requests": len(singles),
            "single_after_gap_p50_ms": ms(percentile(paced, 50)),
            "gap_ms": PACED_GAP_S * 1000 if paced else None,
            "batch_size": batch,
            "max_batch_tokens": self.max_batch_tokens,
            "language_check": clf.language_check,
            "batched_items_per_s": round(batched_items_per_s, 2),
        }


def runtime_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The runtime reference over its rounds: the medians of the per-round figures."""
    summary = dict(rounds[-1])
    del summary["round_no"]
    for key in ("single_p50_ms", "single_p99_ms", "batched_items_per_s", "single_after_gap_p50_ms"):
        values = [r[key] for r in rounds if r.get(key) is not None]
        summary[key] = round(statistics.median(values), 3) if values else None
    summary["single_requests"] = sum(r["single_requests"] for r in rounds)
    summary["rounds"] = len(rounds)
    return summary


# -- servers ----------------------------------------------------------------------------------------


# -- the run ----------------------------------------------------------------------------------------
@dataclass
class HttpPlan:
    concurrency: list[int]
    duration_s: float
    warmup_s: float
    max_requests: int
    batch_items: int
    batch_concurrency: int
    overload_queue: int
    overload_duration_s: float
    naive_concurrency: int
    runtime_duration_s: float
    runtime_batch: int
    start_timeout_s: float
    client: str = "raw"
    rounds: int = 1
    c1_slices: int = 1


def make_plan(args: argparse.Namespace) -> HttpPlan:
    default = "1,4" if args.smoke else "1,8,64,256"
    levels = [int(c) for c in (args.concurrency or default).split(",") if c.strip()]
    if args.smoke:
        return HttpPlan(
            levels, min(args.duration, 0.5), 0.2, 200, 4, 2, 4, 0.5, 4, 0.3, 8, args.start_timeout, args.client, 2, 2
        )
    return HttpPlan(
        levels,
        args.duration,
        args.warmup,
        args.max_requests,
        args.batch_items,
        args.batch_concurrency,
        args.overload_queue,
        args.overload_duration,
        args.naive_concurrency,
        args.runtime_duration,
        args.runtime_batch,
        args.start_timeout,
        args.client,
        args.rounds,
        args.c1_slices,
    )


async def warm_up(url: str, bodies: list[bytes], plan: HttpPlan) -> None:
    await closed_loop(
        url,
        "/v1/classify",
        bodies,
        name="warmup",
        concurrency=8,
        duration_s=plan.warmup_s,
        max_requests=plan.max_requests,
        client=plan.client,
    )


async def run_classify_phases(
    url: str, bodies: list[bytes], plan: HttpPlan, round_no: int, levels: Sequence[int]
) -> list[Phase]:
    """One round: ``/v1/classify`` at each concurrency level of ``levels``, a closed loop of ``duration_s`` each."""
    phases = []
    for c in levels:
        phases.append(
            await closed_loop(
                url,
                "/v1/classify",
                bodies,
                name="classify",
                concurrency=c,
                duration_s=plan.duration_s,
                max_requests=plan.max_requests,
                client=plan.client,
                backoff_on_429_s=RETRY_AFTER_S,
                round_no=round_no,
            )
        )
    return phases


async def run_batch_phase(url: str, batch_bodies: list[bytes], plan: HttpPlan) -> Phase:
    return await closed_loop(
        url,
        "/v1/classify/batch",
        batch_bodies,
        name="batch",
        concurrency=plan.batch_concurrency,
        duration_s=plan.duration_s,
        max_requests=plan.max_requests,
        items_per_request=plan.batch_items,
        client=plan.client,
        backoff_on_429_s=RETRY_AFTER_S,
    )


def measure_in_turns(
    url: str,
    examples: Sequence[Example],
    bodies: list[bytes],
    batch_bodies: list[bytes],
    plan: HttpPlan,
    runtime: RuntimeReference | None,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[list[Phase], list[dict[str, Any]]]:
    """The runtime reference and the service's classify phases in turns, ``plan.rounds`` times (the server
    idles while the runtime runs in this process, and the runtime idles while the server is loaded): a
    machine that speeds up or slows down during the run moves both sides of each round's ratio alike.
    Within a round, the single-dialogue comparison is finer still: ``plan.c1_slices`` slices of runtime
    singles and HTTP c=1 alternate (the machine's speed moves within seconds here). Then the batch phase once."""
    say(f"warm-up: {plan.warmup_s:g} s at c=8")
    run_async(warm_up(url, bodies, plan))
    phases: list[Phase] = []
    runtime_rounds: list[dict[str, Any]] = []
    for round_no in range(1, plan.rounds + 1):
        levels = list(plan.concurrency)
        where = ("runtime, " if runtime is not None else "") + "c=" + ",".join(str(c) for c in levels)
        say(f"round {round_no}/{plan.rounds}: {where}")
        if runtime is not None:
            singles: list[float] = []
            paced: list[float] = []
            if 1 in levels:
                levels.remove(1)
                c1, singles, paced, floor = run_async(paired_singles(url, examples, bodies, plan, runtime, round_no))
                phases += [c1, floor]
            else:
                singles = runtime.singles(examples, duration_s=plan.runtime_duration_s, at_least=20)
            items_per_s = runtime.batched(examples, duration_s=plan.runtime_duration_s, batch=plan.runtime_batch)
            runtime_rounds.append(
                runtime.report(singles, items_per_s, batch=plan.runtime_batch, round_no=round_no, paced=paced)
            )
        phases += run_async(run_classify_phases(url, bodies, plan, round_no, levels))
    say(f"batch phase: {plan.batch_concurrency} clients x {plan.batch_items} items")
    phases.append(run_async(run_batch_phase(url, batch_bodies, plan)))
    return phases, runtime_rounds


async def paired_singles(
    url: str, examples: Sequence[Example], bodies: list[bytes], plan: HttpPlan, runtime: RuntimeReference, round_no: int
) -> tuple[Phase, list[float], list[float], Phase]:
    """HTTP c=1 and the runtime's one-example ``predict`` in alternating slices over the same dialogues:
    the c=1 phase over all its slices, the runtime's latencies (seconds, back to back), the runtime's
    latencies after an idle gap of :data:`PACED_GAP_S` (half as long a share: what the model alone loses
    to the pause a c=1 client's round trip leaves between calls), and the **HTTP floor**: ``GET /health``
    at c=1 through the same server and client (a quarter of each slice's c=1 time), what any answer costs
    before the classifier does anything; c=1 over the runtime less the floor is the classify path's own
    cost (validation, queueing, the inference thread's hand-offs, the answer, the model after a pause)."""
    recorder, floor = PhaseRecorder(), PhaseRecorder()
    singles: list[float] = []
    paced: list[float] = []
    slices = max(1, plan.c1_slices)
    for _ in range(slices):
        first = len(singles)
        singles += runtime.singles(examples, duration_s=plan.runtime_duration_s / slices, first=first)
        paced += runtime.singles(
            examples, duration_s=plan.runtime_duration_s / slices / 2, first=first, gap_s=PACED_GAP_S
        )
        await closed_loop(
            url,
            "/v1/classify",
            bodies,
            name="classify",
            concurrency=1,
            duration_s=plan.duration_s / slices,
            max_requests=plan.max_requests,
            client=plan.client,
            backoff_on_429_s=RETRY_AFTER_S,
            round_no=round_no,
            recorder=recorder,
            first_body=first,
        )
        await closed_loop(
            url,
            HEALTH_PATH,
            [b""],
            name=FLOOR_PHASE,
            concurrency=1,
            duration_s=plan.duration_s / slices / 4,
            max_requests=plan.max_requests,
            client=plan.client,
            round_no=round_no,
            recorder=floor,
            method="GET",
        )
    return (
        recorder.phase("classify", 1, round_no=round_no),
        singles,
        paced,
        floor.phase(FLOOR_PHASE, 1, round_no=round_no),
    )


async def run_overload(server: Server, bodies: list[bytes], plan: HttpPlan, capacity: int) -> dict[str, Any]:
    rss_before = server.rss()
    peak = rss_before or 0
    stop = asyncio.Event()

    async def sample_rss() -> None:  # a monitor, bounded by the phase
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, server.rss() or 0)
            with suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    monitor = asyncio.create_task(sample_rss())
    concurrency = 4 * capacity
    overload = await closed_loop(
        server.url,
        "/v1/classify",
        bodies,
        name="overload",
        concurrency=concurrency,
        duration_s=plan.overload_duration_s,
        max_requests=plan.max_requests * 4,
        timeout_s=30.0,
        client=plan.client,
    )
    stop.set()
    await monitor
    recovery = await closed_loop(
        server.url,
        "/v1/classify",
        bodies,
        name="recovery",
        concurrency=4,
        duration_s=max(plan.overload_duration_s / 2, 0.3),
        max_requests=plan.max_requests,
        client=plan.client,
    )
    rss_after = server.rss()
    bounded = rss_before is not None and peak <= rss_before * 1.5 + 200 * 2**20
    return {
        "max_pending_tokens": 256 * max(1, plan.overload_queue),
        "capacity_items": capacity,
        "concurrency": concurrency,
        "phase": asdict(overload),
        "rejected_429": overload.overloaded,
        "recovery": asdict(recovery),
        "recovered": recovery.errors == 0 and recovery.ok > 0,
        "rss_before_mib": mib(rss_before),
        "rss_peak_mib": mib(peak),
        "rss_after_mib": mib(rss_after),
        "rss_bounded": bounded,
    }


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--model", type=Path, default=None, help=f"ONNX model directory (default {default_model_dir()})")
    p.add_argument("--variant", default=None, help="ONNX variant for the runtime and the service")
    p.add_argument("--data-dir", default=None, help="data directory with the dialogue test splits")
    p.add_argument("--concurrency", default=None, help="comma-separated concurrency levels (default 1,8,64,256)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per load level")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up traffic before measuring")
    p.add_argument("--max-requests", type=int, default=200_000, help="request cap per phase")
    p.add_argument("--batch-items", type=int, default=32, help="items per /v1/classify/batch request")
    p.add_argument("--batch-concurrency", type=int, default=4)
    p.add_argument(
        "--overload-queue",
        type=int,
        default=32,
        help="items the overload-phase server admits, about (max_pending_tokens: 256 per item)",
    )
    p.add_argument("--overload-duration", type=float, default=5.0)
    p.add_argument("--no-overload", action="store_true", help="skip the overload phase")
    p.add_argument("--naive-checkpoint", type=Path, default=None, help="torch checkpoint for the naive baseline")
    p.add_argument("--naive-concurrency", type=int, default=64)
    p.add_argument("--runtime-duration", type=float, default=5.0, help="seconds per runtime reference measure")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of runtime reference and classify phases in turns; targets from the per-round figures' median",
    )
    p.add_argument(
        "--c1-slices",
        type=int,
        default=8,
        help="within a round, runtime singles and HTTP c=1 alternate in this many slices of the two durations",
    )
    p.add_argument("--runtime-batch", type=int, default=64)
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=ServiceSettings.model_fields["max_batch_tokens"].default,
        help="padded tokens per inference call, for the service and the runtime reference alike",
    )
    p.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra service setting for the measured server (SAFETY_<NAME>), e.g. allow_spinning=false; repeatable",
    )
    p.add_argument("--no-runtime", action="store_true", help="skip the in-process runtime reference")
    p.add_argument("--examples", type=int, default=2000, help="distinct dialogues to cycle through")
    p.add_argument("--start-timeout", type=float, default=180.0, help="seconds a server may take to get ready")
    p.add_argument(
        "--client",
        choices=["raw", "httpx"],
        default="raw",
        help="load generator: raw (a lean keep-alive HTTP/1.1 client, default) or httpx.AsyncClient",
    )
    p.add_argument("--smoke", action="store_true", help="every phase for a moment (tests; no targets)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench http") -> int:
    args = build_parser(prog).parse_args(argv)
    plan = make_plan(args)
    model_dir = (args.model or default_model_dir()).resolve()
    problem = model_dir_problem(model_dir)
    if problem:
        print(f"{prog}: {problem}; pass --model DIR (see dialogue-safety export)", file=sys.stderr)
        return 2
    if args.naive_checkpoint is not None:  # checked now, not after every load phase has run
        from dialogue_safety.training.checkpoint_layout import checkpoint_problem

        problem = checkpoint_problem(args.naive_checkpoint)
        if problem:
            print(f"{prog}: --naive-checkpoint: {problem}", file=sys.stderr)
            return 2
        from dialogue_safety.extras import missing_distributions, missing_extra_message

        missing = missing_distributions("train")  # the naive baseline runs transformers on torch
        if missing:
            print(missing_extra_message(f"{prog} --naive-checkpoint", "train", missing), file=sys.stderr)
            return 2

    examples, data_note = load_dialogues(args.data_dir, 200 if args.smoke else args.examples)
    bodies = [json.dumps(request_body(ex)).encode() for ex in examples]
    batch_bodies = [
        json.dumps(
            {"items": [request_body(examples[(i + j) % len(examples)]) for j in range(plan.batch_items)]}
        ).encode()
        for i in range(0, min(len(examples), 50 * plan.batch_items), plan.batch_items)
    ]
    report: dict[str, Any] = {
        "benchmark": "http",
        "smoke": args.smoke,
        "model_dir": str(model_dir),
        "data": data_note,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "client": (f"httpx {httpx.__version__} AsyncClient" if args.client == "httpx" else "raw HTTP/1.1 keep-alive")
        + f", closed loop, one process, {loop_name()} event loop",
        "plan": asdict(plan),
    }

    def say(msg: str) -> None:
        if not args.quiet:
            print(f"[bench http] {msg}", file=sys.stderr, flush=True)

    if args.rounds < 1 or args.c1_slices < 1:
        print(f"{prog}: --rounds and --c1-slices must be >= 1", file=sys.stderr)
        return 2
    extra = server_settings(args.server_setting)
    report["server_settings"] = extra
    runtime = None
    if not args.no_runtime:
        language_check = LANGUAGE_CHECK
        if "language_check" in extra:  # the measured server's, parsed as its settings parse it
            language_check = TypeAdapter(bool).validate_python(extra["language_check"])
        say("loading the runtime reference")
        runtime = RuntimeReference(
            model_dir, variant=args.variant, max_batch_tokens=args.max_batch_tokens, language_check=language_check
        )
    port = free_port()
    say("starting the service (dialogue-safety serve, warm-up included)")
    with running_server(
        service_cmd(model_dir, port, args.variant),
        service_env(**extra, max_batch_tokens=args.max_batch_tokens),
        port,
        start_timeout_s=plan.start_timeout_s,
    ) as server:
        say(f"service ready at {server.url}; {plan.rounds} rounds")
        phases, runtime_rounds = measure_in_turns(server.url, examples, bodies, batch_bodies, plan, runtime, say)
        report["service"] = [asdict(ph) for ph in phases]
        report["service_rss_mib"] = mib(server.rss())
        report["serving"] = _serving(server.url)  # the serving settings in force after the load (admission budgets)
    if runtime_rounds:
        report["runtime_rounds"] = runtime_rounds
        report["runtime"] = runtime_summary(runtime_rounds)
    del runtime  # its session's memory is not needed by the phases below

    if not args.no_overload:
        say(f"overload phase: a second server admitting about {plan.overload_queue} items")
        port = free_port()
        batch_size = max(1, plan.overload_queue)
        env = service_env(
            **extra,
            # about overload_queue items of up to 128 model tokens (a lone client may hold half the budget)
            max_pending_tokens=256 * max(1, plan.overload_queue),
            max_batch_items=min(256, plan.overload_queue),
            max_batch_size=batch_size,
            max_batch_tokens=args.max_batch_tokens,
        )
        with running_server(
            service_cmd(model_dir, port, args.variant), env, port, start_timeout_s=plan.start_timeout_s
        ) as server:
            report["overload"] = run_async(run_overload(server, bodies, plan, plan.overload_queue + batch_size))

    if args.naive_checkpoint is not None:
        say(f"naive baseline: transformers pipeline at c={plan.naive_concurrency}")
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "lab.bench.naive_service",
            "--checkpoint",
            str(args.naive_checkpoint),
            "--host",
            HOST,
            "--port",
            str(port),
        ]
        with running_server(cmd, service_env(), port, start_timeout_s=plan.start_timeout_s) as server:
            naive = run_async(_naive_phases(server.url, bodies, plan))
        report["naive"] = asdict(naive)
    else:
        report["naive"] = None
        report["naive_note"] = "skipped: pass --naive-checkpoint DIR (a torch checkpoint of the same model)"

    report["targets"] = targets(report, plan)
    emit_report(report, markdown(report), args.json)
    return 0


async def _naive_phases(url: str, bodies: list[bytes], plan: HttpPlan) -> Phase:
    await closed_loop(
        url,
        "/v1/classify",
        bodies,
        name="warmup",
        concurrency=1,
        duration_s=plan.warmup_s,
        max_requests=50,
        client=plan.client,
    )
    return await closed_loop(
        url,
        "/v1/classify",
        bodies,
        name="naive",
        concurrency=plan.naive_concurrency,
        duration_s=plan.duration_s,
        max_requests=plan.max_requests,
        timeout_s=300.0,
        client=plan.client,
    )


def _find(phases: list[dict[str, Any]], name: str, concurrency: int) -> dict[str, Any] | None:
    """The last round's phase ``name`` at ``concurrency`` (None: not measured)."""
    found = [ph for ph in phases if ph["name"] == name and ph["concurrency"] == concurrency]
    return found[-1] if found else None


def _per_round(report: dict[str, Any], concurrency: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(runtime reference, classify phase at ``concurrency``) of each round that measured both."""
    runtime = {r["round_no"]: r for r in report.get("runtime_rounds", [])}
    return [
        (runtime[ph["round_no"]], ph)
        for ph in report.get("service", [])
        if ph["name"] == "classify" and ph["concurrency"] == concurrency and ph["round_no"] in runtime
    ]


def _serving(url: str) -> dict[str, Any] | None:
    """The served model's ``serving`` section of ``GET /v1/model`` (None when it cannot be read)."""
    try:
        answer = httpx.get(f"{url}/v1/model", timeout=10.0)
        answer.raise_for_status()
        serving = answer.json().get("serving")
    except (httpx.HTTPError, ValueError):
        return None
    return serving if isinstance(serving, dict) else None


def _median_target(values: list[float], limit: float, *, at_most: bool, digits: int = 3) -> dict[str, Any]:
    value = statistics.median(values)
    met = value <= limit if at_most else value >= limit
    return {"value": round(value, digits), "limit": limit, "met": met, "rounds": [round(v, digits) for v in values]}


def _median_info(values: list[float], note: str, digits: int = 3) -> dict[str, Any]:
    """An informative figure (no limit): the median over the rounds, each round's value beside it."""
    return {
        "value": round(statistics.median(values), digits),
        "rounds": [round(v, digits) for v in values],
        "note": note,
    }


def targets(report: dict[str, Any], plan: HttpPlan) -> dict[str, Any]:
    """The design targets, checked where the run measured what they need (informative in --smoke). The
    service is compared with the runtime round by round (both measured in turns); the value is the median
    over the rounds, each round's figure listed beside it."""
    out: dict[str, Any] = {}
    phases = report.get("service", [])
    runtime = report.get("runtime")
    c1 = [(r, ph) for r, ph in _per_round(report, 1) if ph["p50_ms"] is not None]
    if c1:  # issue 21: HTTP c=1 p50 within 1 ms of the runtime's
        out["c1_p50_over_runtime_ms"] = _median_target(
            [ph["p50_ms"] - r["single_p50_ms"] for r, ph in c1], 1.0, at_most=True
        )
        out["c1_p50_vs_runtime_single"] = {
            "value": round(statistics.median(ph["p50_ms"] / r["single_p50_ms"] for r, ph in c1), 3)
        }
    floors = floors_by_round(phases)
    paired = [(r, ph, floors[r["round_no"]]) for r, ph in c1 if r["round_no"] in floors]
    if paired:  # how much of c=1's excess any HTTP answer costs, and what the classify path adds to it
        out["c1_http_floor_ms"] = _median_info(
            [f for _, _, f in paired],
            f"GET {HEALTH_PATH} at c=1 through the same server and client: what any answer costs",
        )
        out["c1_p50_over_runtime_less_floor_ms"] = _median_info(
            [ph["p50_ms"] - r["single_p50_ms"] - f for r, ph, f in paired],
            f"c=1 over the runtime less GET {HEALTH_PATH} at c=1: the classify path's own cost",
        )
    gaps = [
        r["single_after_gap_p50_ms"] - r["single_p50_ms"] for r, _ in c1 if r.get("single_after_gap_p50_ms") is not None
    ]
    if gaps:  # what the model alone loses to the pause between a c=1 client's requests
        out["runtime_single_after_gap_over_back_to_back_ms"] = _median_info(
            gaps, f"the runtime's single p50 after a {PACED_GAP_S * 1000:g}-ms idle pause, less back to back"
        )
    c64 = [(r, ph) for r, ph in _per_round(report, 64) if r["batched_items_per_s"]]
    if c64:
        out["c64_vs_runtime_batched"] = _median_target(
            [ph["items_per_s"] / r["batched_items_per_s"] for r, ph in c64], 0.9, at_most=False
        )
    c64_phases = [ph for ph in phases if ph["name"] == "classify" and ph["concurrency"] == 64]
    if c64_phases:
        errors = sum(ph["errors"] for ph in c64_phases)
        out["c64_errors"] = {"value": errors, "limit": 0, "met": errors == 0}
    naive = report.get("naive")
    same = _find(phases, "classify", plan.naive_concurrency)
    if naive and same and naive["throughput_rps"]:
        ratio = same["throughput_rps"] / naive["throughput_rps"]
        out[f"c{plan.naive_concurrency}_vs_naive"] = {"value": round(ratio, 2), "limit": 5.0, "met": ratio >= 5.0}
        if runtime and runtime["batched_items_per_s"]:
            # what a zero-overhead HTTP layer could reach: the in-process runtime over the naive service
            ceiling = runtime["batched_items_per_s"] / naive["throughput_rps"]
            out["runtime_batched_vs_naive"] = {"value": round(ceiling, 2), "note": "ceiling for the ratio above"}
    overload = report.get("overload")
    if overload:
        out["overload_429s"] = {"value": overload["rejected_429"], "met": overload["rejected_429"] > 0}
        out["overload_recovered"] = {"met": overload["recovered"]}
        out["overload_rss_bounded"] = {"met": overload["rss_bounded"]}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
