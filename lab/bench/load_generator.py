"""The load generators of the HTTP benchmarks: the closed loop of ``bench http`` (workers that send their
next request when the last one answers, and the latency and status counts of each phase) and the open
loop of ``bench abuse`` (:class:`OpenLoop`: requests sent at their scheduled time whatever the answers,
cheap enough to offer thousands per second from one core)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import httpx

from dialogue_safety.core.schema import Example
from lab.bench.http_client import HOST, RawHttpClient


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
    round_no: int = 0  # which round of a run that measures in turns (bench http --rounds), from 1
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


class PhaseRecorder:
    """What one phase's requests got (latencies by outcome, statuses, time spent), possibly over several
    slices of closed loop (:func:`closed_loop` ``recorder=``), and the :class:`Phase` they make."""

    def __init__(self) -> None:
        self.ok_latencies: list[float] = []
        self.rejected_latencies: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.elapsed_s = 0.0

    def phase(self, name: str, concurrency: int, items_per_request: int = 1, round_no: int = 0) -> Phase:
        ok = self.statuses.get("200", 0)
        total = sum(self.statuses.values())
        elapsed = self.elapsed_s
        return Phase(
            name=name,
            concurrency=concurrency,
            items_per_request=items_per_request,
            round_no=round_no,
            requests=total,
            ok=ok,
            errors=total - ok,
            status_counts=dict(self.statuses),
            elapsed_s=round(elapsed, 3),
            p50_ms=ms(percentile(self.ok_latencies, 50)),
            p95_ms=ms(percentile(self.ok_latencies, 95)),
            p99_ms=ms(percentile(self.ok_latencies, 99)),
            rejected_p50_ms=ms(percentile(self.rejected_latencies, 50)),
            rejected_p99_ms=ms(percentile(self.rejected_latencies, 99)),
            throughput_rps=round(ok / elapsed, 2) if elapsed > 0 else 0.0,
            items_per_s=round(ok * items_per_request / elapsed, 2) if elapsed > 0 else 0.0,
        )


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
    round_no: int = 0,
    recorder: PhaseRecorder | None = None,
    first_body: int = 0,
    method: str = "POST",
) -> Phase:
    """``concurrency`` workers, each sending its next request (``method``; a GET sends no body) when the
    last one answers, until
    ``duration_s`` has passed or ``max_requests`` were sent (whichever comes first).
    ``backoff_on_429_s``: how long a worker waits after a 429 before its next request (a client
    honouring the service's ``Retry-After``; 0: at once, as an abusive client would). ``recorder``:
    add to what earlier slices of the same phase recorded (the phase returned covers them all);
    ``first_body``: where in ``bodies`` this slice starts."""
    rec = recorder if recorder is not None else PhaseRecorder()
    statuses = rec.statuses
    sent = 0
    deadline = time.perf_counter() + duration_s

    async def drive(post: Any, offset: int) -> None:
        nonlocal sent
        while time.perf_counter() < deadline and sent < max_requests:
            body = bodies[(first_body + sent + offset) % len(bodies)]
            sent += 1
            start = time.perf_counter()
            try:
                status = str(await post(body))
            except (OSError, TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError, httpx.HTTPError) as exc:
                status = type(exc).__name__
            took = time.perf_counter() - start
            statuses[status] += 1
            if status == "200":
                rec.ok_latencies.append(took)
            elif status == "429":
                rec.rejected_latencies.append(took)
                if backoff_on_429_s > 0:
                    await asyncio.sleep(min(backoff_on_429_s, max(0.0, deadline - time.perf_counter())))

    started = time.perf_counter()
    if client == "httpx":
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        headers = {"content-type": "application/json"}
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s, headers=headers) as hc:

            async def post_httpx(body: bytes) -> int:
                return (await hc.request(method, path, content=body if method != "GET" else None)).status_code

            await asyncio.gather(*(drive(post_httpx, i * 7919) for i in range(concurrency)))
    else:
        clients = [RawHttpClient(url, timeout_s) for _ in range(concurrency)]

        async def worker(rc: RawHttpClient, offset: int) -> None:
            async def post_raw(body: bytes) -> int:
                return (await rc.request(method, path, body if method != "GET" else b""))[0]

            try:
                await drive(post_raw, offset)
            finally:
                await rc.close()

        await asyncio.gather(*(worker(rc, i * 7919) for i, rc in enumerate(clients)))
    rec.elapsed_s += time.perf_counter() - started
    return rec.phase(name, concurrency, items_per_request, round_no)


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


SMALL = json.dumps({"history": ["hi there"], "utterance": "have a nice day"}).encode()  # a typical request body


class OpenLoopConnection(asyncio.Protocol):
    """One keep-alive connection of :class:`OpenLoop`: one request in flight at a time."""

    def __init__(self, owner: OpenLoop) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.due = 0.0
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport (uvloop's is no asyncio.Transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:")
        length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        del self.buffer[: end + 4 + length]
        self.busy = False
        self.owner.answered(self, int(head[9:12]), b"connection: close" in head)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.lost(self)


class OpenLoop:
    """A load generator cheap enough to offer thousands of requests per second from one core.

    One pre-serialised request, sent over pre-opened keep-alive connections (raw asyncio protocols,
    no HTTP library), each request at its scheduled time whatever the answers before it (an open
    loop). Latency counts from when a request was *due*, so any delay of the generator itself counts
    against the service; ``lag`` (sent - due) says how late the generator was. When every connection
    is busy a request opens a new one (up to ``max_connections``), then waits for a free one: both
    show in ``lag``.
    """

    def __init__(self, port: int, request: bytes, max_connections: int) -> None:
        self.port = port
        self.request = request
        self.max_connections = max_connections
        self.loop = asyncio.get_running_loop()
        self.idle: deque[OpenLoopConnection] = deque()  # first in, first out: none idles past the keep-alive timeout
        self.connections = 0
        self.waiting: deque[float] = deque()  # due times of requests waiting for a connection
        self.latency: dict[int, list[float]] = {}  # status -> seconds from due to answer
        self.answers: list[tuple[float, int, float]] = []  # (due, status, seconds from due to answer)
        self.lag: list[float] = []
        self.failed = 0  # connections lost or refused with a request in flight
        self.in_flight = 0
        self.on_answer: Callable[[OpenLoopConnection, int], None] | None = None
        self._settled: asyncio.Event = asyncio.Event()

    async def open(self, n: int) -> None:
        for _ in range(n):
            _, conn = await self.loop.create_connection(lambda: OpenLoopConnection(self), HOST, self.port)
            self.connections += 1
            self.idle.append(conn)

    def send(self, due: float) -> None:
        self.in_flight += 1
        self._settled.clear()
        if self.idle:
            self._write(self.idle.popleft(), due)
        elif self.connections < self.max_connections:
            self.connections += 1
            self.loop.create_task(self._connect_and_send(due))
        else:
            self.waiting.append(due)

    async def _connect_and_send(self, due: float) -> None:
        try:
            _, conn = await self.loop.create_connection(lambda: OpenLoopConnection(self), HOST, self.port)
        except OSError:
            self.connections -= 1
            self._fail()
            return
        self._write(conn, due)

    def _write(self, conn: OpenLoopConnection, due: float) -> None:
        assert conn.transport is not None
        conn.due, conn.busy = due, True
        self.lag.append(self.loop.time() - due)
        conn.transport.write(self.request)

    def answered(self, conn: OpenLoopConnection, status: int, close: bool) -> None:
        took = self.loop.time() - conn.due
        self.latency.setdefault(status, []).append(took)
        self.answers.append((conn.due, status, took))
        self.in_flight -= 1
        if close and conn.transport is not None:
            conn.transport.close()
        elif self.waiting:
            self._write(conn, self.waiting.popleft())
        else:
            self.idle.append(conn)
        if self.on_answer is not None:
            self.on_answer(conn, status)
        if not self.in_flight:
            self._settled.set()

    def lost(self, conn: OpenLoopConnection) -> None:
        self.connections -= 1
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.busy:
            conn.busy = False
            self._fail()

    def _fail(self) -> None:
        self.failed += 1
        self.in_flight -= 1
        if not self.in_flight:
            self._settled.set()

    async def settle(self, timeout_s: float) -> None:
        """Wait (bounded) for the answers still due; those missing stay in ``in_flight``."""
        if self.in_flight:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), timeout_s)

    def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()

    async def run_schedule(self, rate: float, duration_s: float) -> None:
        """Send ``rate`` x ``duration_s`` requests, evenly spaced (late ones are sent at once)."""
        n = int(rate * duration_s)
        start = self.loop.time() + 0.01
        sent = 0
        done: asyncio.Future[None] = self.loop.create_future()

        def tick() -> None:
            nonlocal sent
            now = self.loop.time()
            while sent < n and start + sent / rate <= now:
                self.send(start + sent / rate)
                sent += 1
            if sent < n:
                self.loop.call_at(start + sent / rate, tick)
            elif not done.done():
                done.set_result(None)

        self.loop.call_at(start, tick)
        await done


def classify_request(body: bytes = SMALL) -> bytes:
    """The whole HTTP/1.1 request for ``body`` (keep-alive), serialised once."""
    return (
        f"POST /v1/classify HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def measure_capacity(port: int, clients: int, warmup_s: float, duration_s: float) -> float:
    """Successful /v1/classify answers per second with ``clients`` closed-loop connections (each sends
    again as soon as it is answered; 10 ms later after a 429), counted after ``warmup_s``."""
    gen = OpenLoop(port, classify_request(), clients)
    await gen.open(clients)
    loop = gen.loop
    counting_from = loop.time() + warmup_s
    stop_at = counting_from + duration_s
    ok = 0

    def again(conn: OpenLoopConnection, status: int) -> None:
        nonlocal ok
        now = loop.time()
        ok += status == 200 and now >= counting_from
        if now < stop_at:
            loop.call_later(0.01 if status == 429 else 0.0, lambda: gen.send(loop.time()))

    gen.on_answer = again
    for _ in range(clients):
        gen.send(loop.time())
    await asyncio.sleep(warmup_s + duration_s)
    await gen.settle(30.0)
    gen.close()
    return ok / duration_s
