"""``dialogue-safety bench http``: the HTTP service under load, next to the runtime and a naive service.

What it does, in one run (all traffic to 127.0.0.1, every loop bounded in time and count):

1. **runtime reference** (in this process, before any server starts): ``OnnxClassifier`` p50 of
   one-example ``predict`` and batched throughput (batches of ``--runtime-batch``);
2. **service** (``dialogue-safety serve`` in a subprocess, one uvicorn worker): a closed-loop
   load generator (``httpx.AsyncClient``) at each ``--concurrency`` for ``--duration`` seconds,
   then batch requests (``/v1/classify/batch``);
3. **overload**: a second server with a small queue, hit with 4x the concurrency its queue
   and one batch can hold: 429s must come back fast, RSS must stay bounded, and a
   recovery phase afterwards must see no errors;
4. **naive** (``--naive-checkpoint DIR``): ``benchmarks/naive_service.py`` (transformers
   pipeline in torch, one request at a time) at ``--naive-concurrency``; the ratio is reported.

Prints JSON and a markdown table; ``--json PATH`` also writes the JSON. ``--smoke`` runs every
phase for a moment (the test suite uses it with a tiny model; no timing targets apply).
Data: the dialogue test splits (DiaSafety, ConvAbuse) via ``training.sources.registry``;
synthetic dialogues when they are not available (noted in the output).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.runtime import emit_report, load_dialogues  # one owner of the benchmark data
from service.schema import Example
from service.settings import ServiceSettings, default_model_dir

HOST = "127.0.0.1"


# -- data ---------------------------------------------------------------------------------------------
def request_body(ex: Example) -> dict[str, Any]:
    history = [{"speaker": t.speaker, "text": t.text} if t.speaker else t.text for t in ex.history]
    return {"history": history, "utterance": ex.utterance}


# -- measurements -------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


@dataclass
class Phase:
    name: str
    concurrency: int
    items_per_request: int = 1
    requests: int = 0
    ok: int = 0
    errors: int = 0
    status_counts: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    rejected_p50_ms: float | None = None  # 429s
    rejected_p99_ms: float | None = None
    throughput_rps: float = 0.0
    items_per_s: float = 0.0

    @property
    def overloaded(self) -> int:
        return self.status_counts.get("429", 0)


class RawHttpClient:
    """A minimal HTTP/1.1 keep-alive client for load generation: one connection per worker.

    httpx costs ~1-2 ms of CPU per request, which on a 2-core machine steals a large share of
    the cores the server is being measured on; this client costs a few tens of microseconds.
    It speaks just what the service answers (Content-Length bodies) and reconnects after errors.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        host_port = url.split("://", 1)[1].rstrip("/")
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            sock = self._writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._reader, self._writer

    async def post(self, path: str, body: bytes, headers: bytes = b"") -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await self._connect()
                writer.write(
                    b"POST "
                    + path.encode()
                    + b" HTTP/1.1\r\nHost: "
                    + self.host.encode()
                    + b"\r\nContent-Type: application/json\r\n"
                    + headers
                    + b"Content-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                status = int((await reader.readline()).split(b" ", 2)[1])
                length, close = 0, False
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                payload = await reader.readexactly(length) if length else b""
                if close:
                    await self.close()
                return status, payload
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with suppress(Exception):
                await writer.wait_closed()


async def closed_loop(
    url: str,
    path: str,
    bodies: Sequence[bytes],
    *,
    name: str,
    concurrency: int,
    duration_s: float,
    max_requests: int,
    items_per_request: int = 1,
    timeout_s: float = 60.0,
    client: str = "raw",
) -> Phase:
    """``concurrency`` workers, each sending its next request when the last one answers, until
    ``duration_s`` has passed or ``max_requests`` were sent (whichever comes first)."""
    ok_latencies: list[float] = []
    rejected_latencies: list[float] = []
    statuses: Counter[str] = Counter()
    sent = 0
    deadline = time.perf_counter() + duration_s

    async def drive(post: Any, offset: int) -> None:
        nonlocal sent
        while time.perf_counter() < deadline and sent < max_requests:
            body = bodies[(sent + offset) % len(bodies)]
            sent += 1
            start = time.perf_counter()
            try:
                status = str(await post(body))
            except (OSError, TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError, httpx.HTTPError) as exc:
                status = type(exc).__name__
            took = time.perf_counter() - start
            statuses[status] += 1
            if status == "200":
                ok_latencies.append(took)
            elif status == "429":
                rejected_latencies.append(took)

    started = time.perf_counter()
    if client == "httpx":
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s, headers=headers) as hc:

            async def post_httpx(body: bytes) -> int:
                return (await hc.post(path, content=body)).status_code

            await asyncio.gather(*(drive(post_httpx, i * 7919) for i in range(concurrency)))
    else:
        clients = [RawHttpClient(url, timeout_s) for _ in range(concurrency)]

        async def worker(rc: RawHttpClient, offset: int) -> None:
            async def post_raw(body: bytes) -> int:
                return (await rc.post(path, body))[0]

            try:
                await drive(post_raw, offset)
            finally:
                await rc.close()

        await asyncio.gather(*(worker(rc, i * 7919) for i, rc in enumerate(clients)))
    elapsed = time.perf_counter() - started
    ok = statuses.get("200", 0)
    total = sum(statuses.values())
    return Phase(
        name=name,
        concurrency=concurrency,
        items_per_request=items_per_request,
        requests=total,
        ok=ok,
        errors=total - ok,
        status_counts=dict(statuses),
        elapsed_s=round(elapsed, 3),
        p50_ms=_ms(percentile(ok_latencies, 50)),
        p95_ms=_ms(percentile(ok_latencies, 95)),
        p99_ms=_ms(percentile(ok_latencies, 99)),
        rejected_p50_ms=_ms(percentile(rejected_latencies, 50)),
        rejected_p99_ms=_ms(percentile(rejected_latencies, 99)),
        throughput_rps=round(ok / elapsed, 2) if elapsed > 0 else 0.0,
        items_per_s=round(ok * items_per_request / elapsed, 2) if elapsed > 0 else 0.0,
    )


def runtime_reference(
    model_dir: Path,
    examples: Sequence[Example],
    *,
    variant: str | None,
    duration_s: float,
    batch: int,
    max_batch_tokens: int,
) -> dict[str, Any]:
    """In-process OnnxClassifier: p50 of one-example predict and batched items/s (encoding included),
    with the same batching budget as the service."""
    from service.runtime import OnnxClassifier

    clf = OnnxClassifier(model_dir, variant=variant, max_batch_tokens=max_batch_tokens)
    clf.warmup()
    singles: list[float] = []
    deadline = time.perf_counter() + duration_s
    for i in range(100_000):
        if time.perf_counter() > deadline and len(singles) >= 20:
            break
        start = time.perf_counter()
        clf.predict([examples[i % len(examples)]])
        singles.append(time.perf_counter() - start)
    items = 0
    started = time.perf_counter()
    deadline = started + duration_s
    for i in range(100_000):
        if time.perf_counter() > deadline and i >= 2:
            break
        chunk = [examples[(i * batch + j) % len(examples)] for j in range(batch)]
        clf.predict(chunk)
        items += len(chunk)
    elapsed = time.perf_counter() - started
    return {
        "model": clf.model_id,
        "variant": clf.variant,
        "provider": clf.provider,
        "single_p50_ms": _ms(percentile(singles, 50)),
        "single_p99_ms": _ms(percentile(singles, 99)),
        "single_requests": len(singles),
        "batch_size": batch,
        "max_batch_tokens": max_batch_tokens,
        "batched_items_per_s": round(items / elapsed, 2),
    }


# -- servers ----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def rss(self) -> int | None:
        return rss_bytes(self.process.pid)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@contextmanager
def running_server(cmd: list[str], env: dict[str, str], port: int, *, start_timeout_s: float) -> Iterator[Server]:
    log = Path(tempfile.mkstemp(prefix="bench-http-", suffix=".log")[1])
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    server = Server(process, f"http://{HOST}:{port}", log)
    try:
        deadline = time.monotonic() + start_timeout_s
        with httpx.Client(base_url=server.url, timeout=2.0) as client:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"server exited with {process.returncode}:\n{server.log_tail()}")
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready after {start_timeout_s:.0f}s:\n{server.log_tail()}")
                time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.unlink(missing_ok=True)


def service_cmd(model_dir: Path, port: int, variant: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "service.cli", "--model", str(model_dir), "--host", HOST, "--port", str(port)]
    cmd += ["--log-level", "warning", "--no-access-log"]
    return cmd + (["--variant", variant] if variant else [])


def server_settings(items: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs → settings for :func:`service_env` (checked against ServiceSettings)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().lower().removeprefix("safety_")
        if not sep or name not in ServiceSettings.model_fields:
            raise SystemExit(f"--server-setting {item!r}: expected NAME=VALUE with NAME a service setting")
        out[name] = value
    return out


def service_env(**settings: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETY_")}
    env.update({f"SAFETY_{k.upper()}": str(v) for k, v in settings.items()})
    return env


# -- the run ----------------------------------------------------------------------------------------
@dataclass
class Plan:
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


def make_plan(args: argparse.Namespace) -> Plan:
    default = "1,4" if args.smoke else "1,8,64,256"
    levels = [int(c) for c in (args.concurrency or default).split(",") if c.strip()]
    if args.smoke:
        return Plan(levels, min(args.duration, 0.5), 0.2, 200, 4, 2, 4, 0.5, 4, 0.3, 8, args.start_timeout, args.client)
    return Plan(
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
    )


async def run_service_phases(url: str, bodies: list[bytes], batch_bodies: list[bytes], plan: Plan) -> list[Phase]:
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
    phases = []
    for c in plan.concurrency:
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
            )
        )
    phases.append(
        await closed_loop(
            url,
            "/v1/classify/batch",
            batch_bodies,
            name="batch",
            concurrency=plan.batch_concurrency,
            duration_s=plan.duration_s,
            max_requests=plan.max_requests,
            items_per_request=plan.batch_items,
            client=plan.client,
        )
    )
    return phases


async def run_overload(server: Server, bodies: list[bytes], plan: Plan, capacity: int) -> dict[str, Any]:
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
        "queue_size": plan.overload_queue,
        "capacity_items": capacity,
        "concurrency": concurrency,
        "phase": asdict(overload),
        "rejected_429": overload.overloaded,
        "recovery": asdict(recovery),
        "recovered": recovery.errors == 0 and recovery.ok > 0,
        "rss_before_mib": _mib(rss_before),
        "rss_peak_mib": _mib(peak),
        "rss_after_mib": _mib(rss_after),
        "rss_bounded": bounded,
    }


def run_async(coro: Any) -> Any:
    """Run with uvloop when it is installed (uvicorn[standard] brings it): a cheaper client."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety bench http") -> int:
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
    p.add_argument("--overload-queue", type=int, default=32, help="queue size of the overload-phase server")
    p.add_argument("--overload-duration", type=float, default=5.0)
    p.add_argument("--no-overload", action="store_true", help="skip the overload phase")
    p.add_argument("--naive-checkpoint", type=Path, default=None, help="torch checkpoint for the naive baseline")
    p.add_argument("--naive-concurrency", type=int, default=64)
    p.add_argument("--runtime-duration", type=float, default=5.0, help="seconds per runtime reference measure")
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
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    args = p.parse_args(argv)
    plan = make_plan(args)
    model_dir = (args.model or default_model_dir()).resolve()
    if not model_dir.is_dir():
        print(
            f"{prog}: no model directory at {model_dir}; pass --model DIR (see dialogue-safety export)", file=sys.stderr
        )
        return 2
    if args.naive_checkpoint is not None:  # checked now, not after every load phase has run
        from training.checkpoint_layout import checkpoint_problem

        problem = checkpoint_problem(args.naive_checkpoint)
        if problem:
            print(f"{prog}: --naive-checkpoint: {problem}", file=sys.stderr)
            return 2
        from cli.extras import missing_distributions, missing_extra_message

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
        + f", closed loop, one process, {_loop_name()} event loop",
        "plan": asdict(plan),
    }

    if not args.no_runtime:
        report["runtime"] = runtime_reference(
            model_dir,
            examples,
            variant=args.variant,
            duration_s=plan.runtime_duration_s,
            batch=plan.runtime_batch,
            max_batch_tokens=args.max_batch_tokens,
        )

    extra = server_settings(args.server_setting)
    report["server_settings"] = extra
    port = free_port()
    with running_server(
        service_cmd(model_dir, port, args.variant),
        service_env(**extra, max_batch_tokens=args.max_batch_tokens),
        port,
        start_timeout_s=plan.start_timeout_s,
    ) as server:
        phases = run_async(run_service_phases(server.url, bodies, batch_bodies, plan))
        report["service"] = [asdict(ph) for ph in phases]
        report["service_rss_mib"] = _mib(server.rss())

    if not args.no_overload:
        port = free_port()
        batch_size = max(1, plan.overload_queue)
        env = service_env(
            **extra,
            queue_size=plan.overload_queue,
            max_batch_items=min(256, plan.overload_queue),
            max_batch_size=batch_size,
            max_batch_tokens=args.max_batch_tokens,
        )
        with running_server(
            service_cmd(model_dir, port, args.variant), env, port, start_timeout_s=plan.start_timeout_s
        ) as server:
            report["overload"] = run_async(run_overload(server, bodies, plan, plan.overload_queue + batch_size))

    if args.naive_checkpoint is not None:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.naive_service",
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


async def _naive_phases(url: str, bodies: list[bytes], plan: Plan) -> Phase:
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
    return next((ph for ph in phases if ph["name"] == name and ph["concurrency"] == concurrency), None)


def targets(report: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """The design targets, checked where the run measured what they need (informative in --smoke)."""
    out: dict[str, Any] = {}
    phases = report.get("service", [])
    runtime = report.get("runtime")
    c1 = _find(phases, "classify", 1)
    c64 = _find(phases, "classify", 64)
    if runtime and c1 and c1["p50_ms"] is not None:
        limit = runtime["single_p50_ms"] + 2.0
        out["c1_p50_ms"] = {"value": c1["p50_ms"], "limit": round(limit, 3), "met": c1["p50_ms"] <= limit}
    if runtime and c64:
        ratio = c64["items_per_s"] / runtime["batched_items_per_s"] if runtime["batched_items_per_s"] else 0.0
        out["c64_vs_runtime_batched"] = {"value": round(ratio, 3), "limit": 0.8, "met": ratio >= 0.8}
    if c64:
        out["c64_errors"] = {"value": c64["errors"], "limit": 0, "met": c64["errors"] == 0}
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


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"HTTP benchmark — model `{report['model_dir']}`, data: {report['data']}, {report['machine']['cpus']} CPUs"
        + (" (SMOKE: no timing meaning)" if report["smoke"] else ""),
        "",
    ]
    runtime = report.get("runtime")
    if runtime:
        lines += [
            f"Runtime reference ({runtime['model']}, {runtime['variant']}, {runtime['provider']}): "
            f"single p50 {runtime['single_p50_ms']} ms, "
            f"batched ({runtime['batch_size']}) {runtime['batched_items_per_s']} items/s",
            "",
        ]
    lines += [
        "| phase | concurrency | requests | errors | 429 | p50 ms | p95 ms | p99 ms | req/s | items/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = list(report.get("service", []))
    overload = report.get("overload")
    if overload:
        rows += [overload["phase"], overload["recovery"]]
    if report.get("naive"):
        rows.append(report["naive"])
    for ph in rows:
        lines.append(
            f"| {ph['name']} | {ph['concurrency']} | {ph['requests']} | {ph['errors']} | "
            f"{ph['status_counts'].get('429', 0)} | {ph['p50_ms']} | {ph['p95_ms']} | {ph['p99_ms']} | "
            f"{ph['throughput_rps']} | {ph['items_per_s']} |"
        )
    if overload:
        lines += [
            "",
            f"Overload: queue {overload['queue_size']}, concurrency {overload['concurrency']}: "
            f"{overload['rejected_429']} x 429 (p50 {overload['phase']['rejected_p50_ms']} ms, p99 "
            f"{overload['phase']['rejected_p99_ms']} ms); RSS {overload['rss_before_mib']} -> peak "
            f"{overload['rss_peak_mib']} -> {overload['rss_after_mib']} MiB (bounded: {overload['rss_bounded']}); "
            f"recovered: {overload['recovered']}",
        ]
    if report.get("naive_note"):
        lines += ["", f"Naive baseline {report['naive_note']}"]
    if report.get("targets"):
        lines += ["", "| target | value | limit | met |", "|---|---:|---:|---|"]
        for name, t in report["targets"].items():
            met = t.get("met", t.get("note", ""))
            lines.append(f"| {name} | {t.get('value', '')} | {t.get('limit', '')} | {met} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
