"""``python -m lab.bench abuse``: replay the attacks of issue 14 against a local server.

Starts ``dialogue-safety serve`` in a subprocess on 127.0.0.1 (never anything else), measures a
well-behaved client (sequential small ``/v1/classify`` requests and ``/health`` probes on
keep-alive connections) while idle, then during each attack, and samples the server's RSS:

* ``idle``: many TCP connections that never send a byte (``--idle``);
* ``slow-bodies``: many requests that announce a 2 MB body and send all but its last byte
  (``--slow-bodies``);
* ``largest``: concurrent requests of the largest allowed size (32 history turns and an
  utterance of 4,000 emoji each) (``--largest``);
* ``overload``: many clients sending single requests back to back (``--overload``, the closed
  loop of the issue: latency there is clients / throughput, whatever the server does);
* ``overload 4x``: an open loop offering ``--overload-factor`` times the capacity measured just
  before (:class:`lab.bench.load_generator.OpenLoop`: pre-serialised requests over
  pre-opened raw connections; latency counts from when each request was due, and the generator's
  own lateness is reported);
* ``hang-ups``: batch requests whose client hangs up before the answer (``--hangups``);
* ``bad-inputs``: hand-made bad requests (lone surrogates, invisible texts, loose types,
  unreadable, compressed, short and empty bodies).

So that the load generator's own work cannot pass for the server's, the server runs on half of
the CPUs and the clients on the other half (``--pin``; 1 + 1 on a 2-core machine), and every
attack runs in its own process: the well-behaved client never shares an event loop with it.

It prints JSON and a markdown table: attack, what the service did, the well-behaved client's
p99 idle and during the attack, RSS before / peak / after. Counts and durations are bounded by
the flags; ``--smoke`` runs every attack briefly with small counts.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import multiprocessing
import os
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dialogue_safety.core.model_dir import default_model_dir
from dialogue_safety.service.routes import HEALTH_PATH
from lab.bench.http_client import HOST, RawHttpClient
from lab.bench.load_generator import (
    SMALL,
    OpenLoop,
    classify_request,
    measure_capacity,
    percentile,
    run_async,
)
from lab.bench.local_server import (
    Server,
    free_port,
    running_server,
    server_settings,
    service_cmd,
    service_env,
)

# what a client sees when the server closes its connection (a cap, a timeout) mid-request
CLOSED = (OSError, TimeoutError, asyncio.IncompleteReadError, IndexError, ValueError)
LARGEST = json.dumps({"history": ["🤬" * 4000] * 32, "utterance": "🤬" * 4000}).encode()
BAD_INPUTS: list[tuple[str, bytes, bytes]] = [  # (name, extra headers, body)
    ("lone surrogate", b"", b'{"utterance": "a\\ud800"}'),
    ("zero-width only", b"", '{"utterance": "\u200b\u200d"}'.encode()),
    ("threshold false", b"", b'{"utterance": "a", "threshold": false}'),
    ("threshold string", b"", b'{"utterance": "a", "threshold": "0.5"}'),
    ("not UTF-8", b"", b'{"utterance": "\xff"}'),
    ("deep JSON", b"", b'{"utterance": "a", "history": ' + b"[" * 50000 + b"]" * 50000 + b"}"),
    ("gzip body", b"Content-Encoding: gzip\r\n", gzip.compress(b'{"utterance": "a"}')),
    ("empty body", b"", b""),
    ("not an object", b"", b"[1, 2]"),
]


@dataclass
class Outcome:
    attack: str
    did: str
    healthy_p99_ms: float | None
    healthy_p99_idle_ms: float | None
    health_p99_ms: float | None
    healthy_errors: int
    rss_before_mib: float | None
    rss_peak_mib: float | None
    rss_after_mib: float | None
    details: dict[str, Any] = field(default_factory=dict)


class Prober:
    """The well-behaved client: one keep-alive connection for /v1/classify, one for /health."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.classify: list[float] = []
        self.health: list[float] = []
        self.errors = 0
        self._stop = asyncio.Event()
        self._client = RawHttpClient(url, 30.0)
        self._health = RawHttpClient(url, 30.0)

    async def connect(self) -> None:
        """Open the keep-alive connections (one request each) before the attack starts."""
        await self._client.post("/v1/classify", SMALL)
        await self._health.request("GET", HEALTH_PATH)

    async def run(self) -> None:
        client, health = self._client, self._health
        try:
            while not self._stop.is_set():
                for path, body, sink in (("/v1/classify", SMALL, self.classify), (HEALTH_PATH, None, self.health)):
                    start = time.perf_counter()
                    try:
                        if body is None:
                            status, _ = await health.request("GET", path)
                        else:
                            status, _ = await client.post(path, body)
                    except CLOSED:
                        self.errors += 1
                        continue
                    if status != 200:
                        self.errors += 1
                        continue
                    sink.append(time.perf_counter() - start)
                await asyncio.sleep(0.02)
        finally:
            await client.close()
            await health.close()

    def stop(self) -> None:
        self._stop.set()


class RssSampler:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.peak = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, self.server.rss() or 0)
            await asyncio.sleep(0.05)

    def start(self) -> None:
        self.peak = self.server.rss() or 0
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> int:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        return self.peak


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _mib(n: int | None) -> float | None:
    return None if n is None else round(n / 2**20, 1)


# -- the attacks: each returns (what the service did, details) ----------------------------------------
async def attack_idle(url: str, n: int, hold_s: float) -> tuple[str, dict[str, Any]]:
    port = int(url.rsplit(":", 1)[1])
    writers: list[asyncio.StreamWriter] = []
    readers: list[asyncio.StreamReader] = []
    failed = 0
    for _ in range(n):
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            failed += 1
            continue
        readers.append(reader)
        writers.append(writer)
    start = time.monotonic()

    async def closed_by_server(reader: asyncio.StreamReader) -> float | None:
        try:
            async with asyncio.timeout(hold_s):
                await reader.read(1)
            return time.monotonic() - start
        except (TimeoutError, OSError):
            return None

    times = await asyncio.gather(*(closed_by_server(r) for r in readers))
    for writer in writers:
        writer.close()
    closed = [t for t in times if t is not None]
    at_once = sum(1 for t in closed if t < 0.5)
    did = (
        f"{len(readers)} connected ({failed} refused by the OS); {at_once} closed within 0.5 s (connection cap), "
        f"{len(closed) - at_once} closed later (head timeout or room for others), "
        f"{len(readers) - len(closed)} still open after {hold_s:g} s"
    )
    return did, {"opened": len(readers), "failed": failed, "closed_at_once": at_once, "closed": len(closed)}


async def attack_slow_bodies(url: str, n: int, body_bytes: int, wait_s: float) -> tuple[str, dict[str, Any]]:
    port = int(url.rsplit(":", 1)[1])
    chunk = b"x" * 65536

    async def one() -> str:
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            return "connect failed"
        try:
            writer.write(
                b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {body_bytes}\r\n\r\n".encode()
            )
            sent = 0
            while sent < body_bytes - 1:  # all but the last byte
                part = chunk[: min(len(chunk), body_bytes - 1 - sent)]
                writer.write(part)
                await writer.drain()
                sent += len(part)
                if reader.at_eof():
                    break
            async with asyncio.timeout(wait_s):
                line = await reader.readline()
            return line.split(b" ", 2)[1].decode() if line else "closed"
        except TimeoutError:
            return "no answer"
        except (OSError, IndexError):
            return "closed"
        finally:
            writer.close()

    statuses = Counter(await asyncio.gather(*(one() for _ in range(n))))
    did = ", ".join(f"{count} x {status}" for status, count in statuses.most_common())
    return did, {"statuses": dict(statuses)}


async def closed_loop(
    url: str,
    clients: int,
    duration_s: float,
    body: bytes,
    on_answer: Callable[[int | None, float], Awaitable[None]],
) -> None:
    """``clients`` keep-alive clients POSTing ``body`` to /v1/classify back to back until the deadline;
    ``on_answer(status, seconds)`` sees every answer (status None: the connection was closed)."""
    deadline = time.monotonic() + duration_s

    async def worker() -> None:
        client = RawHttpClient(url, 60.0)
        try:
            while time.monotonic() < deadline:
                start = time.perf_counter()
                try:
                    status, _ = await client.post("/v1/classify", body)
                except CLOSED:
                    await on_answer(None, time.perf_counter() - start)
                    continue
                await on_answer(status, time.perf_counter() - start)
        finally:
            await client.close()

    await asyncio.gather(*(worker() for _ in range(clients)))


async def attack_largest(url: str, clients: int, duration_s: float) -> tuple[str, dict[str, Any]]:
    statuses: Counter[str] = Counter()
    latencies: list[float] = []

    async def on_answer(status: int | None, elapsed: float) -> None:
        statuses["error" if status is None else str(status)] += 1
        if status is not None:
            latencies.append(elapsed)

    await closed_loop(url, clients, duration_s, LARGEST, on_answer)
    did = f"{sum(statuses.values())} largest requests ({len(LARGEST) // 1024} KiB): " + ", ".join(
        f"{c} x {s}" for s, c in statuses.most_common()
    )
    return did, {"statuses": dict(statuses), "p50_ms": _ms(percentile(latencies, 50))}


async def attack_overload(
    url: str, clients: int, duration_s: float, retry_after_s: float = 1.0
) -> tuple[str, dict[str, Any]]:
    ok: list[float] = []
    refused: list[float] = []
    other: Counter[str] = Counter()

    async def on_answer(status: int | None, elapsed: float) -> None:
        if status == 200:
            ok.append(elapsed)
        elif status == 429:
            refused.append(elapsed)
            await asyncio.sleep(retry_after_s)  # a polite client backs off as told (Retry-After)
        else:
            other["error" if status is None else str(status)] += 1

    await closed_loop(url, clients, duration_s, SMALL, on_answer)
    details = {
        "ok": len(ok),
        "429": len(refused),
        "other": dict(other),
        "ok_p50_ms": _ms(percentile(ok, 50)),
        "ok_p99_ms": _ms(percentile(ok, 99)),
        "ok_max_ms": _ms(max(ok) if ok else None),
        "429_p50_ms": _ms(percentile(refused, 50)),
        "429_p99_ms": _ms(percentile(refused, 99)),
        "ok_per_s": round(len(ok) / duration_s, 1),
    }
    did = (
        f"{clients} clients: {len(ok)} x 200 (p99 {details['ok_p99_ms']} ms, max {details['ok_max_ms']} ms), "
        f"{len(refused)} x 429 (p99 {details['429_p99_ms']} ms)" + (f", other {dict(other)}" if other else "")
    )
    return did, details


def _metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (samples only)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with suppress(ValueError):
                values[name] = float(value)
    return values


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds used so far by the threads of ``pid``: the event loop (the main thread) and the
    others (inference, encoding, onnxruntime's)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        role = "event loop" if task.name == str(pid) else "worker threads"  # inference, encoding (names: 'python')
        out[role] = out.get(role, 0.0) + seconds
    return out


def _stats_ms(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "p50_ms": _ms(percentile(values, 50)),
        "p99_ms": _ms(percentile(values, 99)),
        "max_ms": _ms(max(values) if values else None),
    }


async def attack_open_loop(url: str, factor: float, duration_s: float, server_pid: int) -> tuple[str, dict[str, Any]]:
    """``factor`` x the capacity measured just before, as an open loop (see :class:`load_generator.OpenLoop`).

    The service's bound is on work, not time (``max_pending_tokens``); the time it implies here is the
    classify lane's budget at the speed the attack's batches ran (model tokens per second of inference),
    plus one batch: no accepted request should wait longer than that."""
    budget = (await _admission(url))["classify"]["budget_tokens"]
    port = int(url.rsplit(":", 1)[1])
    capacity = await measure_capacity(port, 64, 1.0, min(5.0, duration_s))
    rate = max(1.0, factor * capacity)
    await asyncio.sleep(1.0)
    # enough connections that requests rarely wait for one (accepted ones wait up to a budget's worth of work)
    connections = int(min(3000, max(64, rate * 2.0)))
    gen = OpenLoop(port, classify_request(), max_connections=3000)
    await gen.open(connections)
    metrics_before, cpu_before, wall_before = (
        _metric_values(await _metrics(url)),
        thread_cpu_s(server_pid),
        time.monotonic(),
    )
    await gen.run_schedule(rate, duration_s)
    await gen.settle(30.0)
    wall = time.monotonic() - wall_before
    metrics_after, cpu_after = _metric_values(await _metrics(url)), thread_cpu_s(server_pid)
    gen.close()

    def delta(name: str) -> float:
        return metrics_after.get(name, 0.0) - metrics_before.get(name, 0.0)

    batches = delta("safety_inference_seconds_count")
    batch_ms = round(delta("safety_inference_seconds_sum") / batches * 1000, 1) if batches else None
    items = delta("safety_batch_size_sum")
    ok, refused = gen.latency.get(200, []), gen.latency.get(429, [])
    other = {str(s): len(v) for s, v in gen.latency.items() if s not in (200, 429)}
    if gen.failed or gen.in_flight:
        other["no answer"] = gen.failed + gen.in_flight
    inference_s = delta("safety_inference_seconds_sum")
    tokens_per_s = delta('safety_request_cost_tokens_sum{lane="classify"}') / inference_s if inference_s else 0.0
    budget_ms = budget / tokens_per_s * 1000 if tokens_per_s else 0.0
    bound_ms = budget_ms + (batch_ms or 0.0)
    ok_stats, refused_stats, lag_stats = _stats_ms(ok), _stats_ms(refused), _stats_ms(gen.lag)
    details: dict[str, Any] = {
        "capacity_per_s": round(capacity, 1),
        "offered_per_s": round(rate, 1),
        "sent": len(gen.lag) + len(gen.waiting),
        "connections": connections,
        "ok": len(ok),
        "ok_per_s": round(len(ok) / duration_s, 1),
        "429": len(refused),
        "other": other,
        **{f"ok_{k}": v for k, v in ok_stats.items()},
        **{f"429_{k}": v for k, v in refused_stats.items()},
        **{f"generator_lag_{k}": v for k, v in lag_stats.items()},
        "max_pending_tokens": budget,
        "model_tokens_per_inference_s": round(tokens_per_s, 1),
        "budget_ms": round(budget_ms, 1),
        "mean_batch_ms": batch_ms,
        "mean_batch_items": round(items / batches, 1) if batches else None,
        "accepted_bound_ms": round(bound_ms, 1),
        "refused_fair_share": int(delta('safety_admission_refused_total{lane="classify",reason="fair_share"}')),
        "refused_busy": int(delta('safety_admission_refused_total{lane="classify",reason="busy"}')),
        "server_cpu_cores": {
            role: round((cpu_after[role] - cpu_before.get(role, 0.0)) / wall, 2) for role in cpu_after
        },
        "target_429_p99_le_50ms": refused_stats["p99_ms"] is not None and refused_stats["p99_ms"] <= 50,
        "target_ok_p99_le_bound": ok_stats["p99_ms"] is not None and ok_stats["p99_ms"] <= bound_ms,
        "target_ok_max_le_bound": ok_stats["max_ms"] is not None and ok_stats["max_ms"] <= bound_ms,
    }
    did = (
        f"{rate:.0f} req/s offered ({factor:g} x {capacity:.0f}/s measured): {len(ok)} x 200 (p99 "
        f"{ok_stats['p99_ms']} ms, max {ok_stats['max_ms']} ms; bound {budget_ms:.0f} + batch {batch_ms} ms), "
        f"{len(refused)} x 429 (p50 {refused_stats['p50_ms']}, p99 {refused_stats['p99_ms']} ms)"
        + (f", other {other}" if other else "")
        + f"; generator lag p99 {lag_stats['p99_ms']} ms"
    )
    return did, details


async def attack_hangups(url: str, n: int) -> tuple[str, dict[str, Any]]:
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"items": ["you are all idiots"] * 64}).encode()
    for _ in range(n):
        _, writer = await asyncio.open_connection(HOST, port)
        writer.write(
            b"POST /v1/classify/batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        await asyncio.sleep(0.002)
        writer.close()
    await asyncio.sleep(1.0)
    metrics = await _metrics(url)
    batch = {
        line.split('status="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("safety_requests_total") and 'route="/v1/classify/batch"' in line
    }
    return f"{n} hung-up batch requests counted as {batch}", {"batch_statuses": batch}


async def attack_bad_inputs(url: str) -> tuple[str, dict[str, Any]]:
    results: dict[str, int] = {}
    for name, headers, body in BAD_INPUTS:
        client = RawHttpClient(url, 30.0)
        try:
            status, _ = await client.post("/v1/classify", body, headers)
        except CLOSED as exc:
            status = -1
            results[name + f" ({type(exc).__name__})"] = status
            continue
        finally:
            await client.close()
        results[name] = status
    fivexx = sum(1 for s in results.values() if s >= 500 or s < 0)
    did = f"{len(results)} bad inputs: " + ", ".join(f"{k} {v}" for k, v in results.items()) + f"; {fivexx} 5xx/none"
    return did, {"statuses": results}


async def _metrics(url: str, path: str = "/metrics") -> str:
    client = RawHttpClient(url, 10.0)
    try:
        _, body = await client.request("GET", path)
    finally:
        await client.close()
    return body.decode(errors="replace")


async def _admission(url: str) -> dict[str, Any]:
    """The admission budgets the server applies (GET /v1/model)."""
    admission: dict[str, Any] = json.loads(await _metrics(url, "/v1/model"))["serving"]["admission"]
    return admission


# -- the run ---------------------------------------------------------------------------------------
Attack = tuple[Callable[..., Awaitable[tuple[str, dict[str, Any]]]], tuple[Any, ...]]


def _run_attack(attack: Attack) -> tuple[str, dict[str, Any]]:
    """In the attacker process: run one attack to its end."""
    function, args = attack
    result: tuple[str, dict[str, Any]] = run_async(function(*args))
    return result


async def measure(
    server: Server,
    name: str,
    attack: Attack,
    attacker: ProcessPoolExecutor,
    idle_p99: float | None,
    settle_s: float = 2.0,
) -> Outcome:
    """Run ``attack`` in the attacker process while the well-behaved client (here, in another
    process: the attack's own work never delays it) measures the service."""
    await asyncio.sleep(settle_s / 2)  # let the previous attack's connections drain
    before = server.rss()
    sampler = RssSampler(server)
    sampler.start()
    prober = Prober(server.url)
    await prober.connect()
    probe = asyncio.create_task(prober.run())
    did, details = await asyncio.get_running_loop().run_in_executor(attacker, _run_attack, attack)
    prober.stop()
    await probe
    await asyncio.sleep(settle_s)  # then 'after' is measured
    peak = await sampler.stop()
    return Outcome(
        attack=name,
        did=did,
        healthy_p99_ms=_ms(percentile(prober.classify, 99)),
        healthy_p99_idle_ms=_ms(idle_p99),
        health_p99_ms=_ms(percentile(prober.health, 99)),
        healthy_errors=prober.errors,
        rss_before_mib=_mib(before),
        rss_peak_mib=_mib(peak),
        rss_after_mib=_mib(server.rss()),
        details=details,
    )


async def run_all(server: Server, args: argparse.Namespace, attacker: ProcessPoolExecutor) -> list[Outcome]:
    await asyncio.get_running_loop().run_in_executor(attacker, _run_attack, (asyncio.sleep, (0,)))  # started
    prober = Prober(server.url)
    await prober.connect()
    probe = asyncio.create_task(prober.run())
    await asyncio.sleep(args.idle_probe_s)
    prober.stop()
    await probe
    idle = percentile(prober.classify, 99)
    url = server.url
    attacks: list[tuple[str, Attack]] = [
        ("idle connections", (attack_idle, (url, args.idle, args.hold_s))),
        ("slow bodies", (attack_slow_bodies, (url, args.slow_bodies, 2 * 1024 * 1024, args.hold_s))),
        ("largest requests", (attack_largest, (url, args.largest, args.duration_s))),
        ("overload", (attack_overload, (url, args.overload, args.duration_s))),
        (
            "overload 4x",
            (
                attack_open_loop,
                (url, args.overload_factor, args.duration_s, server.process.pid),
            ),
        ),
        ("hang-ups", (attack_hangups, (url, args.hangups))),
        ("bad inputs", (attack_bad_inputs, (url,))),
    ]
    selected = set(args.attacks.split(",")) if args.attacks else None
    outcomes = []
    for name, attack in attacks:
        if selected is None or name in selected or name.split()[0] in selected:
            outcomes.append(await measure(server, name, attack, attacker, idle, args.settle_s))
    return outcomes


def cpu_split(spec: str) -> tuple[set[int], set[int]] | None:
    """``--pin``: 'auto' splits the CPUs this process may use in two halves (server, clients); 'off'
    pins nothing; 'S:C' gives comma-separated CPU lists, e.g. '0:1'."""
    if spec == "off":
        return None
    if spec == "auto":
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return None
        half = len(cpus) // 2
        return set(cpus[:half]), set(cpus[half:])
    server, _, clients = spec.partition(":")
    return {int(c) for c in server.split(",")}, {int(c) for c in clients.split(",")}


@contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """This process (and the processes it starts meanwhile) on ``cpus``; restored afterwards."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def markdown(outcomes: Sequence[Outcome], settings: dict[str, str]) -> str:
    lines = [
        "| attack | what the service did | healthy p99 idle → during (ms) | /health p99 (ms) | healthy errors "
        "| RSS before / peak / after (MiB) |",
        "|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.attack} | {o.did} | {o.healthy_p99_idle_ms} → {o.healthy_p99_ms} | {o.health_p99_ms} | "
            f"{o.healthy_errors} | {o.rss_before_mib} / {o.rss_peak_mib} / {o.rss_after_mib} |"
        )
    if settings:
        lines.append("")
        lines.append("server settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    return "\n".join(lines)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--model", type=Path, default=default_model_dir(), help="exported ONNX model directory")
    p.add_argument("--idle", type=int, default=10000, help="idle connections to open")
    p.add_argument("--slow-bodies", type=int, default=1000, help="requests that never finish their 2 MB body")
    p.add_argument("--largest", type=int, default=4, help="concurrent clients sending the largest allowed request")
    p.add_argument("--overload", type=int, default=512, help="clients sending single requests back to back")
    p.add_argument("--overload-factor", type=float, default=4.0, help="open-loop offered load / measured capacity")
    p.add_argument("--hangups", type=int, default=50, help="batch requests whose client hangs up")
    p.add_argument("--duration-s", type=float, default=10.0, help="seconds of the largest and overload attacks")
    p.add_argument("--hold-s", type=float, default=12.0, help="how long idle/slow clients wait for the server")
    p.add_argument("--settle-s", type=float, default=2.0, help="pause after each attack before RSS 'after'")
    p.add_argument("--idle-probe-s", type=float, default=5.0, help="seconds the healthy client is measured idle")
    p.add_argument("--attacks", default="", help="comma-separated subset: idle,slow,largest,overload,hang-ups,bad")
    p.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a service setting for the server (repeatable), e.g. header_timeout_s=2",
    )
    p.add_argument(
        "--pin",
        default="auto",
        help="CPUs for the server and for the clients: 'auto' (half each, e.g. 0 and 1 on 2 cores: the load "
        "generator cannot steal the server's core), 'off', or 'SERVER:CLIENTS' lists such as '0:1'",
    )
    p.add_argument("--json", type=Path, default=None, help="write the report here (e.g. runs/abuse.json)")
    p.add_argument("--smoke", action="store_true", help="every attack briefly with small counts")
    p.add_argument("--start-timeout-s", type=float, default=180.0)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench abuse") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.smoke:
        args.idle, args.slow_bodies, args.largest, args.overload, args.hangups = 60, 20, 2, 32, 5
        args.duration_s, args.hold_s, args.idle_probe_s, args.settle_s = 1.5, 3.0, 1.0, 0.5
    settings = server_settings(args.server_setting)
    if args.smoke:
        settings = {"header_timeout_s": "1", "body_timeout_s": "1", "max_connections": "40", **settings}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    split = cpu_split(args.pin)
    server_cpus, client_cpus = split if split is not None else (None, None)
    port = free_port()
    with pinned(client_cpus):
        with pinned(server_cpus):
            starting = running_server(
                service_cmd(args.model, port, None),
                service_env(**settings),
                port,
                start_timeout_s=args.start_timeout_s,
            )
            server = starting.__enter__()  # the server process inherits the server CPUs
        try:
            # the attacks run in their own process, started now (on the client CPUs)
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as attacker:
                outcomes = asyncio.run(run_all(server, args, attacker))
        finally:
            starting.__exit__(None, None, None)
    machine = {
        "cpus": os.cpu_count(),
        "server_cpus": sorted(server_cpus) if server_cpus else None,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }
    report = {
        "model": str(args.model),
        "server_settings": settings,
        "machine": machine,
        "outcomes": [asdict(o) for o in outcomes],
    }
    print(json.dumps(report, indent=2))
    print()
    print(markdown(outcomes, settings))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
