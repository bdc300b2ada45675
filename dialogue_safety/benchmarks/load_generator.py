"""The closed-loop load generator of the HTTP benchmarks: workers that send their next request when the
last one answers, and the latency and status counts of each phase."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from dialogue_safety.benchmarks.http_client import RawHttpClient
from dialogue_safety.core.schema import Example


def request_body(ex: Example) -> dict[str, Any]:
    history = [{"speaker": t.speaker, "text": t.text} if t.speaker else t.text for t in ex.history]
    return {"history": history, "utterance": ex.utterance}


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def ms(value: float | None) -> float | None:
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
    backoff_on_429_s: float = 0.0,
) -> Phase:
    """``concurrency`` workers, each sending its next request when the last one answers, until
    ``duration_s`` has passed or ``max_requests`` were sent (whichever comes first).
    ``backoff_on_429_s``: how long a worker waits after a 429 before its next request (a client
    honouring the service's ``Retry-After``; 0: at once, as an abusive client would)."""
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
                if backoff_on_429_s > 0:
                    await asyncio.sleep(min(backoff_on_429_s, max(0.0, deadline - time.perf_counter())))

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
        p50_ms=ms(percentile(ok_latencies, 50)),
        p95_ms=ms(percentile(ok_latencies, 95)),
        p99_ms=ms(percentile(ok_latencies, 99)),
        rejected_p50_ms=ms(percentile(rejected_latencies, 50)),
        rejected_p99_ms=ms(percentile(rejected_latencies, 99)),
        throughput_rps=round(ok / elapsed, 2) if elapsed > 0 else 0.0,
        items_per_s=round(ok * items_per_request / elapsed, 2) if elapsed > 0 else 0.0,
    )


def run_async(coro: Any) -> Any:
    """Run with uvloop when it is installed (uvicorn[standard] brings it): a cheaper client."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"
