"""``python -m lab.bench abuse``: replay the attacks of issues 14, 39 and 55 against a local server.

Starts ``dialogue-safety serve`` in a subprocess on 127.0.0.1 (never anything else), measures a
well-behaved client (sequential small ``/v1/classify`` requests and ``/health`` probes on
keep-alive connections) while idle, then during each attack, and samples the server's RSS:

* ``idle``: many TCP connections that never send a byte (``--idle``);
* ``slow-bodies``: many requests that announce a 2 MB body and send all but its last byte
  (``--slow-bodies``);
* ``largest requests``: concurrent requests of the largest allowed size (32 history turns and an
  utterance of 4,000 emoji each) (``--largest``);
* ``largest utterance``: one client sending the largest legal single request (a 4,000-character utterance of
  prose after 32 history turns of 4,000 characters: every window within ``SAFETY_MAX_WINDOWS``), again and again;
* ``largest explained``: one client asking for the explanation of a 4,000-character utterance,
  again and again (the admission plans an explanation that fits, or answers 413);
* ``largest batch``: one client sending the largest batch of 4,000-character items the limits
  allow (``max_batch_items``, or fewer if their cost passes the one-request limit), again and
  again, and once one item more;
* ``million invalid`` (issue 55): one client sending 2 MB bodies of a million invalid elements (the
  texts of ``/v1/moderations``, the items of a batch, a history), back to back: each is answered 4xx
  from its counts, or 429 before it is read while that client's large bodies are paused after a refused one
  (target: within 200 ms at p99, the server's RSS growing by 50 MiB at most);
* ``too costly`` (issue 55): one client sending a batch that can never fit (``max_batch_items`` items
  of 4,000 characters), back to back: 413 from its characters, never tokenised (or 429 before it is read:
  after a refused large body, that client's next ones are paused, ``SAFETY_REFUSED_BODY_SHARE``);
* ``overload``: many clients sending single requests back to back (``--overload``, the closed
  loop of the issue: latency there is clients / throughput, whatever the server does);
* ``overload 4x``: an open loop offering ``--overload-factor`` times the capacity measured just
  before (:class:`lab.bench.load_generator.OpenLoop`: pre-serialised requests over
  pre-opened raw connections; latency counts from when each request was due, and the generator's
  own lateness is reported);
* ``hang-ups``: batch requests whose client hangs up before the answer (``--hangups``);
* ``bad-inputs``: hand-made bad requests (lone surrogates, invisible texts, loose types,
  unreadable, compressed, short and empty bodies);
* ``http edges``: duplicate JSON keys, a body nested 3,000 deep, ``POST /v1/classify/`` with
  ``Host: evil.example``, a request head over ``max_header_bytes`` on ``--head-connections``
  connections at once, unparsable requests (request line, header, chunk size);
* ``hot swaps``: ``--swaps`` hot swaps (``POST /admin/model``) to the model directory served;
  the process's memory and threads before and after;
* ``break-it ids``: ids and round numbers of 2**63 and 10**23 on the break-it routes;
* ``corpus nested line``: no server: ``dialogue-safety score`` on a corpus with a line nested
  3,000 deep and a whitespace-only line, interrupted once, then resumed;
* ``policy regex``, ``policy reload``, ``corpus hostile csv``: the operator's rules and the CSV reader
  (:mod:`lab.bench.abuse_rules`: a nested-quantifier pattern and a 100,000-term block list, hostile
  ``POST /admin/policy`` paths, hostile CSV records).

The hot swaps and break-it ids run against a second server, started with an API key (the admin
routes need one) and the break-it game on a temporary SQLite file. The attackers of the largest
utterance, explained request and batch connect from another loopback address (127.0.0.2): the admission
charges work per client address, and they are other clients than the well-behaved one; their
``target_prober_*`` keys are the issue's bar (its p99 within 3x the quiet p99, none refused).

So that the load generator's own work cannot pass for the server's, the server runs on half of
the CPUs and the clients on the other half (``--pin``; 1 + 1 on a 2-core machine), and every
attack runs in its own process: the well-behaved client never shares an event loop with it.

It prints JSON and a markdown table: attack, what the service did, the well-behaved client's
p99 idle and during the attack, RSS before / peak / after, and the attack's targets (each
``target_*`` key of its details: met or not). Counts and durations are bounded by the flags;
``--smoke`` runs every attack briefly with small counts.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import multiprocessing
import os
import re
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dialogue_safety.core.model_dir import default_model_dir
from dialogue_safety.corpus.job import PARTS_SUFFIX, STATS_SUFFIX
from dialogue_safety.service.routes import HEALTH_PATH
from dialogue_safety.service.settings import ServiceSettings
from lab.bench import abuse_rules
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

    def __init__(self, url: str, headers: bytes = b"") -> None:
        self.url = url
        self.headers = headers  # sent with /v1/classify (the API key of a server that has one)
        self.classify: list[float] = []
        self.health: list[float] = []
        self.errors = 0
        self.statuses: Counter[str] = Counter()  # of its /v1/classify requests ('closed': no answer)
        self.health_statuses: Counter[str] = Counter()
        self._stop = asyncio.Event()
        self._client = RawHttpClient(url, 30.0)
        self._health = RawHttpClient(url, 30.0)

    async def connect(self) -> None:
        """Open the keep-alive connections (one request each) before the attack starts."""
        await self._client.post("/v1/classify", SMALL, self.headers)
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
                            self.health_statuses[str(status)] += 1
                        else:
                            status, _ = await client.post(path, body, self.headers)
                            self.statuses[str(status)] += 1
                    except CLOSED:
                        self.errors += 1
                        (self.statuses if body is not None else self.health_statuses)["closed"] += 1
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


async def attack_open_loop(
    url: str, factor: float, duration_s: float, server_pid: int, max_connections: int
) -> tuple[str, dict[str, Any]]:
    """``factor`` x the capacity measured just before, as an open loop (see :class:`load_generator.OpenLoop`).

    The service's bound is on work, not time (``max_pending_tokens``); the time it implies here is the
    classify lane's budget at the speed the attack's batches ran (model tokens per second of inference),
    plus one batch: no accepted request should wait longer than that."""
    budget = (await _admission(url))["classify"]["budget_tokens"]
    port = int(url.rsplit(":", 1)[1])
    capacity = await measure_capacity(port, 64, 1.0, min(5.0, duration_s))
    rate = max(1.0, factor * capacity)
    await asyncio.sleep(1.0)
    # enough connections that requests rarely wait for one (accepted ones wait up to a budget's worth of
    # work, seconds on a small CPU): as many as the server accepts, less room for the prober and /health
    cap = max(1, max_connections - min(96, max_connections // 4))
    connections = int(min(cap, max(64, rate * 2.0)))
    gen = OpenLoop(port, classify_request(), max_connections=cap)
    await gen.open(connections)
    metrics_before, cpu_before, wall_before = (
        _metric_values(await _metrics(url)),
        thread_cpu_s(server_pid),
        time.monotonic(),
    )
    started = gen.loop.time()
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
        "max_connections": cap,
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
        "by_second": _by_second(gen.answers, started),
        "server_cpu_cores": {
            role: round((cpu_after[role] - cpu_before.get(role, 0.0)) / wall, 2) for role in cpu_after
        },
        "server_thread_nice": abuse_rules.thread_nices(server_pid),  # SAFETY_INFERENCE_NICE reaches every thread?
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


def _by_second(answers: list[tuple[float, int, float]], start: float) -> list[dict[str, Any]]:
    """Per second of the schedule (by when a request was due): its 200s and 429s, and their p99 (ms)."""
    seconds: dict[int, dict[int, list[float]]] = {}
    for due, status, took in answers:
        seconds.setdefault(int(due - start), {}).setdefault(status, []).append(took)
    rows = []
    for second in sorted(seconds):
        row: dict[str, Any] = {"second": second}
        for status, name in ((200, "ok"), (429, "429")):
            got = seconds[second].get(status, [])
            row[name] = len(got)
            row[f"{name}_p99_ms"] = _stats_ms(got)["p99_ms"]
        rows.append(row)
    return rows


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


# -- round two (issue 39): the largest allowed requests, hot swaps, HTTP edges, break-it ids, a corpus line ---
# another loopback address: the server charges work per client address, and the attacker of these cases
# is another client than the well-behaved one (on Linux every 127.x.y.z reaches a server on 127.0.0.1)
ATTACKER_HOST = "127.0.0.2"
# 4,000 characters of prose (the per-text limit): ~1,000 tokens, read in ~10 windows
TEXT_4K = ("honestly you people are the worst thing that ever happened to this forum and " * 60)[:4000]
EXPLAINED_4K = json.dumps({"utterance": TEXT_4K, "explain": True}).encode()
# the largest legal single request: the longest utterance and history the limits take, every window within the cap
UTTERANCE_4K = json.dumps({"history": [TEXT_4K] * 32, "utterance": TEXT_4K}).encode()
DEEP = 3000  # brackets: the nesting that crashed the JSON parsers of round one
COST = re.compile(r"cost(?:s| up to) (\d+) model tokens")


def can_bind(address: str) -> bool:
    """Whether this machine can open a connection from ``address`` (a loopback address other than 127.0.0.1)."""
    try:
        with socket.socket() as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def attacker_source() -> str | None:
    """:data:`ATTACKER_HOST` if this machine can connect from it, else None (the attacker then shares the
    well-behaved client's address, and its fair share: the details say which)."""
    return ATTACKER_HOST if can_bind(ATTACKER_HOST) else None


def _auth(key: str | None) -> bytes:
    return f"Authorization: Bearer {key}\r\n".encode() if key else b""


def _error_code(body: bytes) -> str | None:
    """The ``error.code`` of the JSON error shape, or None if ``body`` is not one."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


def _setting(settings: dict[str, str], name: str) -> Any:
    """A service setting's value for the bench's server: given (``--server-setting``) or its default."""
    default = ServiceSettings.model_fields[name].default
    return type(default)(settings[name]) if name in settings else default


async def _statuses_for(
    url: str, path: str, body: bytes, duration_s: float, headers: bytes = b"", wait_out_pause: bool = False
) -> tuple[Counter[str], list[float]]:
    """One client sending ``body`` to ``path`` back to back for ``duration_s``: 'STATUS code' counts, latencies.
    ``wait_out_pause``: a pause of this address's large bodies left by an earlier attack is waited out first
    (that first answer counted, not timed)."""
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    client = RawHttpClient(url, 600.0, attacker_source())
    try:
        if wait_out_pause:
            status, answer = await _post_after_pause(client, path, body)
            code = _error_code(answer) if status != 200 else None
            statuses[f"{status} {code}" if code else str(status)] += 1
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                status, answer = await client.post(path, body, headers)
            except CLOSED:
                statuses["closed"] += 1
                await asyncio.sleep(0.05)  # not a busy loop against a server that closes at once
                continue
            latencies.append(time.perf_counter() - start)
            code = _error_code(answer) if status != 200 else None
            statuses[f"{status} {code}" if code else str(status)] += 1
    finally:
        await client.close()
    return statuses, latencies


def _counts(statuses: Counter[str]) -> str:
    return ", ".join(f"{c} x {s}" for s, c in statuses.most_common())


async def attack_largest_utterance(url: str, duration_s: float) -> tuple[str, dict[str, Any]]:
    """One client (another address) sending the largest legal single request again and again: a 4,000-character
    utterance (~10 windows, each a row twice: with the history and alone) after 32 history turns of 4,000."""
    return await _one_request_looped(url, UTTERANCE_4K, duration_s, "4,000-char utterances after 32 turns")


async def attack_largest_explained(url: str, duration_s: float) -> tuple[str, dict[str, Any]]:
    """One client (another address) asking for the explanation of a 4,000-character utterance, again and again:
    the admission plans an explanation within half the explain lane's budget, or refuses it (413)."""
    return await _one_request_looped(url, EXPLAINED_4K, duration_s, "explained 4,000-char utterances")


async def _one_request_looped(url: str, body: bytes, duration_s: float, what: str) -> tuple[str, dict[str, Any]]:
    """One client (another address) posting ``body`` to /v1/classify again and again for ``duration_s``."""
    statuses, latencies = await _statuses_for(url, "/v1/classify", body, duration_s)
    details = {
        "statuses": dict(statuses),
        "body_bytes": len(body),
        "attacker_address": attacker_source() or HOST,
        **_stats_ms(latencies),
    }
    return f"{sum(statuses.values())} {what}: {_counts(statuses)}", details


def _batch(n: int) -> bytes:
    return json.dumps({"items": [TEXT_4K] * n}).encode()


PAUSED = re.compile(r"send another such body in ([0-9.]+) s")


async def _post_after_pause(client: RawHttpClient, path: str, body: bytes) -> tuple[int, bytes]:
    """``client.post``, waiting out (at most twice) the pause of this client's large bodies after a refused one
    (429, ``SAFETY_REFUSED_BODY_SHARE``), as a well-behaved client does: to learn what the server answers."""
    for _ in range(3):
        status, answer = await client.post(path, body)
        paused = PAUSED.search(answer.decode(errors="replace")) if status == 429 else None
        if paused is None:
            break
        await asyncio.sleep(float(paused.group(1)) + 0.05)
        await client.close()  # the server may close an idle keep-alive connection meanwhile: a new one
    return status, answer


async def _largest_batch_items(url: str, max_items: int, max_request_tokens: int) -> tuple[int, str]:
    """The most 4,000-character items one batch may hold: ``max_batch_items``, or fewer if their cost passes
    the one-request limit (the 413 of ``max_batch_items`` says what that many cost when they were tokenised;
    refused by what they cost at least, the largest answered batch is found by halving). (items, how it was found)"""
    client = RawHttpClient(url, 600.0, attacker_source())
    try:
        status, answer = await client.post("/v1/classify/batch", _batch(max_items))
        if status != 413:
            return max_items, f"{max_items} items (max_batch_items) answered {status}"
        found = COST.search(json.loads(answer)["error"]["message"])
        if found is not None:  # the real cost of that many (they were tokenised)
            per_item = int(found.group(1)) // max_items
            return max(1, min(max_items, max_request_tokens // per_item)), (
                f"{per_item} model tokens an item, {max_request_tokens} a request at most"
            )
        # refused by what it costs at least (untokenised, and counted only past the limit): halve until answered
        fits, refused = 0, max_items
        while refused - fits > 1:
            n = (fits + refused) // 2
            status, _ = await _post_after_pause(client, "/v1/classify/batch", _batch(n))
            fits, refused = (n, refused) if status == 200 else (fits, n)
        return max(1, fits), f"the largest batch answered 200, by bisection ({max_request_tokens} a request at most)"
    finally:
        await client.close()


async def attack_largest_batch(url: str, duration_s: float, max_items: int) -> tuple[str, dict[str, Any]]:
    """One client (another address) sending the largest batch of 4,000-character items the limits allow, again
    and again; and once one item more (refused: 413)."""
    admission = await _admission(url)
    max_request_tokens = int(admission["classify"]["max_request_tokens"])
    n, why = await _largest_batch_items(url, max_items, max_request_tokens)
    over = RawHttpClient(url, 600.0, attacker_source())
    try:
        status, answer = (
            await _post_after_pause(over, "/v1/classify/batch", _batch(n + 1)) if n < max_items else (None, b"")
        )
    finally:
        await over.close()
    one_more = None if status is None else f"{status} {_error_code(answer) or ''}".strip()
    statuses, latencies = await _statuses_for(url, "/v1/classify/batch", _batch(n), duration_s)
    details = {
        "items": n,
        "how": why,
        "max_batch_items": max_items,
        "max_request_tokens": max_request_tokens,
        "one_more_item": one_more,
        "statuses": dict(statuses),
        "body_bytes": len(_batch(n)),
        "attacker_address": attacker_source() or HOST,
        **_stats_ms(latencies),
    }
    did = f"{sum(statuses.values())} batches of {n} 4,000-char items ({why}): {_counts(statuses)}; {n + 1} items: "
    return did + (one_more or "over max_batch_items"), details


# a 2 MB body of a million invalid elements, in each list a request names (issue 55): one 4xx each, cheap
MILLION = 1_000_000
MILLION_INVALID: dict[str, tuple[str, bytes]] = {
    "moderations input": ("/v1/moderations", json.dumps({"input": [0] * MILLION}, separators=(",", ":")).encode()),
    "batch items": ("/v1/classify/batch", json.dumps({"items": [0] * MILLION}, separators=(",", ":")).encode()),
    "history": (
        "/v1/classify",
        json.dumps({"utterance": "x", "history": [0] * MILLION}, separators=(",", ":")).encode(),
    ),
}
REFUSAL_BOUND_S = 0.2  # the bar for each of those answers
RSS_GROWTH_BOUND_MIB = 50.0


def _server_cpu_ms(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float | None]:
    """The server's CPU per request (ms) between two :func:`thread_cpu_s` readings, on the event loop and in
    the other threads (the well-behaved client's few requests meanwhile count too): what a request costs the
    server whatever else loads the machine."""
    return {
        f"server_cpu_ms_per_request_{role.replace(' ', '_')}": (
            None if not requests else round((after.get(role, 0.0) - before.get(role, 0.0)) * 1000 / requests, 1)
        )
        for role in ("event loop", "worker threads")
    }


async def attack_million_invalid(url: str, duration_s: float, pid: int) -> tuple[str, dict[str, Any]]:
    """One client (another address) sending 2 MB bodies of a million invalid elements (the list of texts of
    /v1/moderations, the items of a batch, the history of /v1/classify), back to back: each is refused
    from its counts (4xx naming the list and its limit), before any element is validated."""
    cases: dict[str, dict[str, Any]] = {}
    latencies: list[float] = []
    for name, (path, body) in MILLION_INVALID.items():
        cpu_before = thread_cpu_s(pid)
        statuses, seconds = await _statuses_for(url, path, body, duration_s / len(MILLION_INVALID), wait_out_pause=True)
        cpu = _server_cpu_ms(cpu_before, thread_cpu_s(pid), len(seconds))
        latencies += seconds
        cases[name] = {"statuses": dict(statuses), "body_bytes": len(body), **_stats_ms(seconds), **cpu}
    every = Counter[str]()
    for case in cases.values():
        every.update(case["statuses"])
    p99 = percentile(latencies, 99)
    details = {
        "cases": cases,
        "attacker_address": attacker_source() or HOST,
        **_stats_ms(latencies),
        "target_4xx_each": bool(every) and all(s[:1] == "4" for s in every),
        "target_answer_p99_le_200ms": p99 is not None and p99 <= REFUSAL_BOUND_S,
    }
    return f"{sum(every.values())} bodies of a million invalid elements: {_counts(every)}", details


async def attack_too_costly(url: str, duration_s: float, max_items: int, pid: int) -> tuple[str, dict[str, Any]]:
    """One client (another address) sending a batch that can never fit (``max_batch_items`` items of 4,000
    characters, ~1 MB), back to back: refused 413 from its characters, never tokenised (the server's
    tokenisation count does not move)."""
    before = _metric_values(await _metrics(url)).get("safety_tokenization_seconds_count", 0.0)
    cpu_before = thread_cpu_s(pid)
    statuses, latencies = await _statuses_for(
        url, "/v1/classify/batch", _batch(max_items), duration_s, wait_out_pause=True
    )
    cpu = _server_cpu_ms(cpu_before, thread_cpu_s(pid), len(latencies))
    after = _metric_values(await _metrics(url)).get("safety_tokenization_seconds_count", 0.0)
    details = {
        "items": max_items,
        "statuses": dict(statuses),
        "body_bytes": len(_batch(max_items)),
        "attacker_address": attacker_source() or HOST,
        "tokenisations_meanwhile": after - before,  # the well-behaved client's own requests count here too
        **_stats_ms(latencies),
        **cpu,
        # 413 untokenised, or 429 before it is read: the client's large bodies paused after a refused one
        "target_all_413_or_paused": "413 request_too_costly" in statuses
        and set(statuses) <= {"413 request_too_costly", "429 overloaded"},
    }
    return f"{sum(statuses.values())} batches of {max_items} 4,000-char items: {_counts(statuses)}", details


def proc_status(pid: int, field_name: str) -> int | None:
    """A number from /proc/PID/status (VmRSS in kB, Threads)."""
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return None


async def attack_hot_swaps(url: str, n: int, model_dir: str, key: str, pid: int) -> tuple[str, dict[str, Any]]:
    """``n`` hot swaps (``POST /admin/model``, with the API key) to ``model_dir``, one after another, while the
    well-behaved client is served: the process's memory and threads before and after, each swap's time."""
    rss_before, threads_before = proc_status(pid, "VmRSS"), proc_status(pid, "Threads")
    body = json.dumps({"model_dir": model_dir}).encode()
    client = RawHttpClient(url, 600.0)
    statuses: Counter[str] = Counter()
    durations: list[float] = []
    released = 0
    threads: list[int | None] = []  # after each swap
    try:
        for _ in range(n):
            start = time.perf_counter()
            try:
                status, answer = await client.post("/admin/model", body, _auth(key))
            except CLOSED:
                statuses["closed"] += 1
                continue
            durations.append(time.perf_counter() - start)
            statuses[str(status)] += 1
            if status == 200 and json.loads(answer).get("released"):
                released += 1
            threads.append(proc_status(pid, "Threads"))
    finally:
        await client.close()
    await asyncio.sleep(1.0)  # what the last swap freed is given back to the OS by now
    rss_after, threads_after = proc_status(pid, "VmRSS"), proc_status(pid, "Threads")
    change = None if not rss_before or rss_after is None else (rss_after - rss_before) / rss_before * 100
    details = {
        "swaps": n,
        "statuses": dict(statuses),
        "released": released,
        "rss_before_mib": _mib(None if rss_before is None else rss_before * 1024),
        "rss_after_mib": _mib(None if rss_after is None else rss_after * 1024),
        "rss_change_pct": None if change is None else round(change, 1),
        "threads_before": threads_before,
        "threads_after_each_swap": threads,
        "threads_after": threads_after,
        "swap_s_p50": None if not durations else round(percentile(durations, 50) or 0.0, 2),
        "swap_s_max": None if not durations else round(max(durations), 2),
        "target_rss_within_10pct": change is not None and abs(change) <= 10,
        # thread pools that start lazily (asyncio's executor, up to CPUs + 4) may add a few: a leak adds some per swap
        "target_no_thread_per_swap": threads_before is not None
        and threads_after is not None
        and threads_after - threads_before < n,
        "target_every_swap_ok": statuses.get("200", 0) == n,
    }
    did = (
        f"{n} swaps: {_counts(statuses)}, {released} released the old model; RSS {details['rss_before_mib']} -> "
        f"{details['rss_after_mib']} MiB ({details['rss_change_pct']} %), threads {threads_before} -> "
        f"{threads_after}; a swap took {details['swap_s_p50']} s (p50), "
        f"{details['swap_s_max']} s at most"
    )
    return did, details


def _exchange(port: int, request: bytes, timeout_s: float = 30.0) -> dict[str, Any]:
    """``request`` as it is on a fresh connection, read until the server closes it: the answer's status (None:
    closed without one), whether its body is the JSON error shape, whether it redirects (a Location header).
    A blocking socket: a refused head's answer is still read after the send failed (asyncio's reader drops it)."""
    raw = b""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s) as sock:
            with suppress(OSError):  # closed while sending (a refused head): the answer was written first
                sock.sendall(request)
            with suppress(OSError):
                while chunk := sock.recv(65536):
                    raw += chunk
    except OSError:
        pass
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        status: int | None = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        status = None
    names = {line.partition(":")[0].strip().lower() for line in lines[1:]}
    return {"status": status, "json_error": _error_code(body) is not None, "location": "location" in names}


def http_edges(max_header_bytes: int) -> list[tuple[str, bytes]]:
    """(name, raw request) of the HTTP edge cases; each asks the server to close the connection."""

    def post(path: str, body: bytes, host: str = HOST) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    big_head = b"GET /health HTTP/1.1\r\nHost: localhost\r\n" + b"".join(
        f"X-Big-{i}: {'b' * 1000}\r\n".encode() for i in range(64 * max_header_bytes // 1000)
    )
    return [
        ("duplicate keys", post("/v1/classify", b'{"utterance": "have a nice day", "utterance": "you idiot"}')),
        (
            f"{DEEP:,}-deep body",
            post("/v1/classify", b'{"utterance": "a", "history": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
        ),
        ("POST /v1/classify/ Host: evil.example", post("/v1/classify/", b'{"utterance": "hi"}', host="evil.example")),
        ("bad request line", b"GARBAGE\r\n\r\n"),
        ("bad header", b"GET /health HTTP/1.1\r\nBad Header Name: x\r\n\r\n"),
        (
            "bad chunk",
            b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        ),
        (f"head of {len(big_head) // 1024} KiB", big_head + b"\r\n"),
    ]


async def attack_http_edges(url: str, max_header_bytes: int, head_connections: int) -> tuple[str, dict[str, Any]]:
    """Each HTTP edge case once, the oversized head on ``head_connections`` connections at once."""
    port = int(url.rsplit(":", 1)[1])
    cases: dict[str, dict[str, Any]] = {}
    for name, request in http_edges(max_header_bytes):
        if name.startswith("head of"):
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(head_connections) as threads:  # all at once
                answers = await asyncio.gather(
                    *(loop.run_in_executor(threads, _exchange, port, request) for _ in range(head_connections))
                )
            statuses = Counter(str(a["status"]) for a in answers)
            cases[f"{name} x {head_connections}"] = {
                "statuses": dict(statuses),
                "json_error": all(a["json_error"] for a in answers if a["status"] is not None),
                "location": any(a["location"] for a in answers),
            }
        else:
            answer = await asyncio.to_thread(_exchange, port, request)
            cases[name] = {"statuses": {str(answer["status"]): 1}, **answer}
            del cases[name]["status"]
    every = [(status, case) for case in cases.values() for status in case["statuses"]]
    fivexx = sum(1 for status, _ in every if status != "None" and int(status) >= 500)
    details = {
        "cases": cases,
        "max_header_bytes": max_header_bytes,
        "5xx": fivexx,
        "target_no_5xx": fivexx == 0,
        "target_no_redirect": not any(case["location"] for case in cases.values()),
        "target_every_answer_json": all(case["json_error"] for case in cases.values()),
    }
    did = "; ".join(
        f"{name}: {'/'.join(case['statuses'])}{'' if case['json_error'] else ' (not JSON)'}"
        + (" REDIRECT" if case["location"] else "")
        for name, case in cases.items()
    )
    return did + f"; {fivexx} 5xx", details


BIG_IDS = (9223372036854775808, 10**23)  # 2**63 (past SQLite's integers) and 10**23


async def attack_breakit_ids(url: str, key: str) -> tuple[str, dict[str, Any]]:
    """Ids and round numbers no database column holds, on the break-it routes (an invited player's token)."""
    client = RawHttpClient(url, 60.0)
    results: dict[str, int] = {}
    try:
        status, answer = await client.post(
            "/break-it/api/admin/players", json.dumps({"nicknames": ["bench-player"]}).encode(), _auth(key)
        )
        if status != 200:
            return f"inviting a player answered {status}", {"invite": status, "statuses": {}}
        token = json.loads(answer)["players"][0]["token"]
        player = f"X-Player-Token: {token}\r\n".encode()
        for n in BIG_IDS:
            calls: list[tuple[str, str, bytes | None, bytes]] = [
                ("GET", f"/break-it/api/round?round={n}", None, b""),
                ("GET", f"/break-it/api/tasks/{n}", None, player),
                ("POST", f"/break-it/api/tasks/{n}/attacks", b'{"text": "hello"}', player),
                ("POST", f"/break-it/api/attacks/{n}/validations", b'{"verdict": "confirm"}', player),
                ("GET", f"/break-it/api/scoreboard?round={n}", None, player),
            ]
            for method, path, body, headers in calls:
                try:
                    status, _ = await client.request(method, path, body or b"", headers)
                except CLOSED:
                    status = -1
                results[f"{method} {path}"] = status
    finally:
        await client.close()
    bad = {call: status for call, status in results.items() if not 400 <= status < 500}
    did = f"{len(results)} calls with ids of 2**63 and 10**23: " + _counts(Counter(str(s) for s in results.values()))
    return did, {"statuses": results, "not_4xx": bad, "target_all_4xx": not bad}


# -- the corpus job: not HTTP --------------------------------------------------------------------------
def corpus_lines(rows: int) -> tuple[list[str], int, int]:
    """A JSONL corpus of ``rows`` good lines with one line nested 3,000 brackets deep (line 3) and one
    whitespace-only line (line 5): the lines, the deep line's number and the blank line's."""
    lines = [json.dumps({"id": i, "utterance": f"message {i}: have a nice day"}) for i in range(rows)]
    lines.insert(2, "[" * DEEP + "]" * DEEP)
    lines.insert(4, "   \t ")
    return lines, 3, 5


def _score_cmd(model_dir: str, inp: Path, out: Path, chunk_size: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dialogue_safety.cli.main",
        "score",
        str(inp),
        str(out),
        "--model",
        model_dir,
        "--chunk-size",
        str(chunk_size),
        "--no-progress",
    ]


def corpus_nested_line(model_dir: str, rows: int) -> tuple[str, dict[str, Any]]:
    """``dialogue-safety score`` on a corpus with the deep line and a blank one, interrupted (SIGINT) once
    its first parts are written, then run again: it resumes, exits 0, and the deep line is an error row."""
    with tempfile.TemporaryDirectory(prefix="abuse-corpus-") as tmp:
        inp, out = Path(tmp) / "hostile.jsonl", Path(tmp) / "scored.jsonl"
        lines, deep_line, blank_line = corpus_lines(rows)
        inp.write_text("\n".join(lines) + "\n")
        cmd = _score_cmd(model_dir, inp, out, max(1, rows // 100))
        env = service_env()
        parts = out.with_name(out.name + PARTS_SUFFIX)
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # interrupted once its first part is complete (its stats file is renamed into place last)
        while first.poll() is None and not any(parts.glob(f"*{STATS_SUFFIX}")):
            time.sleep(0.002)
        if first.poll() is None:
            first.send_signal(signal.SIGINT)
        first_stderr = first.communicate(timeout=300)[1].decode(errors="replace")
        interrupted = first.returncode == 130
        second = subprocess.run(cmd, env=env, capture_output=True, timeout=600, check=False)
        summary: dict[str, Any] = {}
        with suppress(ValueError, IndexError):
            summary = json.loads(second.stdout.decode().strip().splitlines()[-1])
        errors = []
        if out.exists():
            for line in out.read_text().splitlines():
                error = json.loads(line).get("error")
                if isinstance(error, str):  # a nested field a format keeps as JSON text
                    with suppress(ValueError):
                        error = json.loads(error)
                if error:
                    errors.append(error["message"] if isinstance(error, dict) else str(error))
    named = [e for e in errors if e.startswith(f"{inp.name}:{deep_line}: ")]
    details = {
        "rows": rows + 1,
        "first_run_exit": first.returncode,
        "first_run_stderr_tail": first_stderr[-300:] if first.returncode not in (0, 130) else "",
        "interrupted": interrupted,
        "exit": second.returncode,
        "stderr_tail": second.stderr.decode(errors="replace")[-300:] if second.returncode else "",
        "summary": summary,
        "error_rows": errors,
        "target_exit_0": second.returncode == 0,
        "target_error_row_names_file_and_line": len(named) == 1 and len(errors) == 1,
        "target_blank_line_counted": summary.get("blank_lines") == 1,
        "target_every_row_written": summary.get("rows") == rows + 1 and summary.get("scored") == rows,
        "target_resumed": (summary.get("resumed_rows", 0) > 0) if interrupted else None,
    }
    error_row = named[0][:160] if named else "none naming the line"
    resumed = f"interrupted, then resumed ({summary.get('resumed_rows')} rows kept); " if interrupted else ""
    did = (
        f"{rows + 1} rows, line {deep_line} nested {DEEP:,} deep, line {blank_line} blank: {resumed}exit "
        f"{second.returncode}, {summary.get('errors')} error row(s) ({error_row}), "
        f"{summary.get('blank_lines')} blank line(s) counted"
    )
    return did, details


async def attack_corpus_nested_line(model_dir: str, rows: int) -> tuple[str, dict[str, Any]]:
    return await asyncio.to_thread(corpus_nested_line, model_dir, rows)


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


@dataclass(frozen=True)
class Target:
    """The server an attack is aimed at (``key``: its API key, None for the server without one)."""

    url: str
    pid: int
    key: str | None = None


# every attack: (name, the server it needs, how it is built). 'plain': the server as configured; 'keyed':
# one started with an API key and the break-it game (the admin routes need the key, and swaps change the
# server); 'none': no server (the corpus job). The prober's p99 targets apply to PROBER_TARGETS.
ServerKind = Literal["plain", "keyed", "none"]
ATTACKS: list[tuple[str, ServerKind, Callable[[argparse.Namespace, Target], Attack]]] = [
    ("idle connections", "plain", lambda a, t: (attack_idle, (t.url, a.idle, a.hold_s))),
    ("slow bodies", "plain", lambda a, t: (attack_slow_bodies, (t.url, a.slow_bodies, 2 * 1024 * 1024, a.hold_s))),
    ("largest requests", "plain", lambda a, t: (attack_largest, (t.url, a.largest, a.duration_s))),
    ("largest utterance", "plain", lambda a, t: (attack_largest_utterance, (t.url, a.duration_s))),
    ("largest explained", "plain", lambda a, t: (attack_largest_explained, (t.url, a.duration_s))),
    ("largest batch", "plain", lambda a, t: (attack_largest_batch, (t.url, a.duration_s, a.max_batch_items))),
    ("million invalid", "plain", lambda a, t: (attack_million_invalid, (t.url, a.duration_s, t.pid))),
    ("too costly", "plain", lambda a, t: (attack_too_costly, (t.url, a.duration_s, a.max_batch_items, t.pid))),
    ("overload", "plain", lambda a, t: (attack_overload, (t.url, a.overload, a.duration_s))),
    (
        "overload 4x",
        "plain",
        lambda a, t: (attack_open_loop, (t.url, a.overload_factor, a.duration_s, t.pid, a.max_connections)),
    ),
    ("hang-ups", "plain", lambda a, t: (attack_hangups, (t.url, a.hangups))),
    ("bad inputs", "plain", lambda a, t: (attack_bad_inputs, (t.url,))),
    ("http edges", "plain", lambda a, t: (attack_http_edges, (t.url, a.max_header_bytes, a.head_connections))),
    ("hot swaps", "keyed", lambda a, t: (attack_hot_swaps, (t.url, a.swaps, str(a.model), t.key, t.pid))),
    ("break-it ids", "keyed", lambda a, t: (attack_breakit_ids, (t.url, t.key))),
    ("corpus nested line", "none", lambda a, t: (attack_corpus_nested_line, (str(a.model), a.corpus_rows))),
    (
        "policy regex",
        "none",
        lambda a, t: (abuse_rules.attack_policy_regex, (str(a.model), 2000 if a.smoke else abuse_rules.BIG_LIST)),
    ),
    ("policy reload", "keyed", lambda a, t: (abuse_rules.attack_policy_reload, (t.url, t.key, a.policy_dir))),
    ("corpus hostile csv", "none", lambda a, t: (abuse_rules.attack_corpus_hostile_csv, (str(a.model),))),
]
# the bar while one client sends the largest allowed request: the others within 3x their quiet p99
PROBER_TARGETS = {"largest utterance", "largest explained", "largest batch", "million invalid", "too costly"}
RSS_TARGETS = {"million invalid", "too costly"}  # the server's RSS grows by at most RSS_GROWTH_BOUND_MIB
QUIET_P99_FACTOR = 3.0
DROPS_NOTHING = {"hot swaps"}  # the well-behaved client's every request answered 200 meanwhile


def selected_attacks(spec: str) -> list[tuple[str, ServerKind, Callable[[argparse.Namespace, Target], Attack]]]:
    """``--attacks``: comma-separated names or first words ('largest' selects the four largest-request attacks)."""
    chosen = {s.strip() for s in spec.split(",") if s.strip()}
    out = [a for a in ATTACKS if not chosen or a[0] in chosen or a[0].split()[0] in chosen]
    unknown = chosen - {a[0] for a in ATTACKS} - {a[0].split()[0] for a in ATTACKS}
    if unknown:
        raise SystemExit(f"--attacks: unknown {sorted(unknown)}; the attacks: {', '.join(a[0] for a in ATTACKS)}")
    return out


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
    headers: bytes = b"",
) -> Outcome:
    """Run ``attack`` in the attacker process while the well-behaved client (here, in another
    process: the attack's own work never delays it) measures the service."""
    await asyncio.sleep(settle_s / 2)  # let the previous attack's connections drain
    before = server.rss()
    sampler = RssSampler(server)
    sampler.start()
    prober = Prober(server.url, headers)
    await prober.connect()
    probe = asyncio.create_task(prober.run())
    did, details = await asyncio.get_running_loop().run_in_executor(attacker, _run_attack, attack)
    prober.stop()
    await probe
    await asyncio.sleep(settle_s)  # then 'after' is measured
    peak = await sampler.stop()
    healthy_p99 = percentile(prober.classify, 99)
    refused = sum(count for status, count in prober.statuses.items() if status != "200")
    if name in PROBER_TARGETS | DROPS_NOTHING:
        details["prober_statuses"] = dict(prober.statuses)
        details["prober_health_statuses"] = dict(prober.health_statuses)
    if name in PROBER_TARGETS:
        details["target_prober_p99_within_3x_quiet"] = (
            healthy_p99 is not None and idle_p99 is not None and healthy_p99 <= QUIET_P99_FACTOR * idle_p99
        )
        details["target_prober_none_refused"] = refused == 0
    if name in DROPS_NOTHING:
        details["target_prober_nothing_dropped"] = refused == 0
    if name in RSS_TARGETS:
        growth = None if before is None or peak is None else (peak - before) / 2**20
        details["rss_growth_mib"] = None if growth is None else round(growth, 1)
        details["target_rss_growth_le_50mib"] = growth is not None and growth <= RSS_GROWTH_BOUND_MIB
    return Outcome(
        attack=name,
        did=did,
        healthy_p99_ms=_ms(healthy_p99),
        healthy_p99_idle_ms=_ms(idle_p99),
        health_p99_ms=_ms(percentile(prober.health, 99)),
        healthy_errors=prober.errors,
        rss_before_mib=_mib(before),
        rss_peak_mib=_mib(peak),
        rss_after_mib=_mib(server.rss()),
        details=details,
    )


async def run_all(
    server: Server,
    args: argparse.Namespace,
    attacker: ProcessPoolExecutor,
    attacks: Sequence[tuple[str, Callable[[argparse.Namespace, Target], Attack]]],
    key: str | None = None,
) -> list[Outcome]:
    """The well-behaved client's quiet p99 on ``server``, then each attack while it is measured."""
    await asyncio.get_running_loop().run_in_executor(attacker, _run_attack, (asyncio.sleep, (0,)))  # started
    headers = _auth(key)
    prober = Prober(server.url, headers)
    await prober.connect()
    probe = asyncio.create_task(prober.run())
    await asyncio.sleep(args.idle_probe_s)
    prober.stop()
    await probe
    idle = percentile(prober.classify, 99)
    target = Target(server.url, server.process.pid, key)
    return [
        await measure(server, name, build(args, target), attacker, idle, args.settle_s, headers)
        for name, build in attacks
    ]


async def run_offline(name: str, attack: Attack) -> Outcome:
    """An attack that needs no server (the corpus job): no prober, no server RSS."""
    function, fargs = attack
    did, details = await function(*fargs)
    return Outcome(name, did, None, None, None, 0, None, None, None, details)


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


def targets(details: dict[str, Any]) -> str:
    """The attack's ``target_*`` booleans as 'name yes/no' (None: not exercised this run)."""
    marks = {True: "yes", False: "**NO**", None: "n/a"}
    return "; ".join(f"{k.removeprefix('target_')} {marks[v]}" for k, v in details.items() if k.startswith("target_"))


def markdown(outcomes: Sequence[Outcome], settings: dict[str, str]) -> str:
    def cell(value: object) -> str:
        return "–" if value is None else str(value)

    lines = [
        "| attack | what the service did | healthy p99 idle → during (ms) | /health p99 (ms) | healthy errors "
        "| RSS before / peak / after (MiB) | targets |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.attack} | {o.did} | {cell(o.healthy_p99_idle_ms)} → {cell(o.healthy_p99_ms)} | "
            f"{cell(o.health_p99_ms)} | {o.healthy_errors} | {cell(o.rss_before_mib)} / {cell(o.rss_peak_mib)} / "
            f"{cell(o.rss_after_mib)} | {targets(o.details) or '–'} |"
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
    p.add_argument("--swaps", type=int, default=20, help="hot swaps (POST /admin/model) to the same model directory")
    p.add_argument(
        "--head-connections", type=int, default=16, help="connections sending a request head over max_header_bytes"
    )
    p.add_argument("--corpus-rows", type=int, default=1000, help="good rows of the corpus with the nested line")
    p.add_argument("--duration-s", type=float, default=10.0, help="seconds of the largest and overload attacks")
    p.add_argument("--hold-s", type=float, default=12.0, help="how long idle/slow clients wait for the server")
    p.add_argument("--settle-s", type=float, default=2.0, help="pause after each attack before RSS 'after'")
    p.add_argument("--idle-probe-s", type=float, default=5.0, help="seconds the healthy client is measured idle")
    p.add_argument(
        "--attacks",
        default="",
        help="comma-separated subset, by name or first word: "
        + ", ".join(sorted({name.split()[0] for name, _, _ in ATTACKS}))
        + " ('largest' is the four largest-request attacks; 'largest batch' one of them)",
    )
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
    p.add_argument(
        "--door",
        choices=("asgi", "head"),
        default="asgi",
        help="where the overloaded service's 429 is answered: 'asgi' (the service's middleware) or 'head' (the "
        "lab.experiments.head_door protocol, from the request head): to compare the two under one load",
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
        args.swaps, args.corpus_rows = 2, 200
    attacks = selected_attacks(args.attacks)
    settings = server_settings(args.server_setting)
    if args.smoke:
        settings = {"header_timeout_s": "1", "body_timeout_s": "1", "max_connections": "40", **settings}
    args.max_batch_items = _setting(settings, "max_batch_items")
    args.max_connections = _setting(settings, "max_connections")
    args.max_header_bytes = _setting(settings, "max_header_bytes")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    split = cpu_split(args.pin)
    server_cpus, client_cpus = split if split is not None else (None, None)
    outcomes: list[Outcome] = []
    with pinned(client_cpus), tempfile.TemporaryDirectory(prefix="abuse-") as tmp:
        key = secrets.token_urlsafe(24)
        keyed = {**settings, "api_key": key, "breakit_db": str(Path(tmp) / "breakit.sqlite3")}
        if any(name == "policy reload" for name, _, _ in attacks):  # a start-up policy and a policy directory
            keyed.update(abuse_rules.policy_files(Path(tmp)))
            args.policy_dir = keyed["policy_dir"]
        for kind, kind_settings, kind_key in (("plain", settings, None), ("keyed", keyed, key)):
            chosen = [(name, build) for name, needs, build in attacks if needs == kind]
            if not chosen:
                continue
            port = free_port()
            with pinned(server_cpus):
                cmd = service_cmd(args.model, port, None)
                if args.door == "head":  # the experiment's server: the same CLI, the 429 from the request head
                    cmd[cmd.index("dialogue_safety.service.cli")] = "lab.experiments.head_door"
                starting = running_server(
                    cmd,
                    service_env(**kind_settings),
                    port,
                    start_timeout_s=args.start_timeout_s,
                )
                server = starting.__enter__()  # the server process inherits the server CPUs
            try:
                # the attacks run in their own process, started now (on the client CPUs)
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as attacker:
                    outcomes += asyncio.run(run_all(server, args, attacker, chosen, kind_key))
            finally:
                starting.__exit__(None, None, None)
        for name, needs, build in attacks:
            if needs == "none":
                outcomes.append(asyncio.run(run_offline(name, build(args, Target("", 0)))))
    machine = {
        "cpus": os.cpu_count(),
        "server_cpus": sorted(server_cpus) if server_cpus else None,
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }
    report = {
        "model": str(args.model),
        "server_settings": settings,
        "door": args.door,
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
