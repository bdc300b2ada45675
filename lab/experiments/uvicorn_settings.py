"""Do uvicorn's own settings give what the service's protocol subclass gives? (issue 53)

:func:`dialogue_safety.service.server.uvicorn_config` runs uvicorn with a subclass of its httptools protocol
that reaches private request-cycle internals (and so pins uvicorn to one minor version). This experiment
runs the same tiny ASGI app (a JSON 200) under three configurations on 127.0.0.1, in this process:

* ``service``: the service's configuration (the subclass; header limit 8192 bytes, head timeout 2 s,
  4096 connections at most);
* ``h11``: uvicorn's h11 protocol with its own settings, the closest there are:
  ``h11_max_incomplete_event_size=8192``, ``limit_concurrency=4096``, ``timeout_keep_alive=2``;
* ``httptools``: uvicorn's default protocol with ``limit_concurrency=4096``, ``timeout_keep_alive=2``
  (it has no header limit setting);

and probes each as a hostile client would:

* ``head_100kb``: one request whose head carries a 100 KB header: the status answered (the service: 431 in
  its JSON error shape, as ``tests/test_hostile_clients.py`` asserts), and whether the connection closes;
* ``idle``: ``--idle`` connections opened that never send a byte, then, after the head timeout and a second,
  how many the server has closed; and whether a new client is then served (200) or refused;
* ``slowloris``: one connection sending its request head one byte every 0.5 s: seconds until the server
  closes it (``None``: still open at ``--slow-s``).

It prints JSON and a markdown table. Counts and statuses, not timings: a loaded machine gives the same answers.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn

from dialogue_safety.service.server import uvicorn_config
from dialogue_safety.service.settings import ServiceSettings
from lab.bench.emit import emit_report
from lab.bench.local_server import free_port

HEADER_LIMIT = 8192
HEAD_TIMEOUT_S = 2
CONNECTIONS = 4096


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b'{"status":"ok"}'
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _config(kind: str, port: int) -> uvicorn.Config:
    common: dict[str, Any] = dict(host="127.0.0.1", port=port, log_level="critical", lifespan="off")
    if kind == "service":
        settings = ServiceSettings(
            max_header_bytes=HEADER_LIMIT, header_timeout_s=HEAD_TIMEOUT_S, max_connections=CONNECTIONS
        )
        return uvicorn_config(_app, settings, **common)
    options: dict[str, Any] = dict(limit_concurrency=CONNECTIONS, timeout_keep_alive=HEAD_TIMEOUT_S)
    if kind == "h11":
        return uvicorn.Config(_app, http="h11", h11_max_incomplete_event_size=HEADER_LIMIT, **options, **common)
    return uvicorn.Config(_app, http="httptools", **options, **common)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def _status(sock: socket.socket) -> tuple[int | None, bool]:
    """The status of the answer read on ``sock`` and whether the server then closed the connection."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    sock.settimeout(1)
    try:
        while sock.recv(65536):
            pass
        closed = True
    except TimeoutError:
        closed = False
    except OSError:
        closed = True
    return status, closed


def _get(port: int) -> int | None:
    try:
        sock = _connect(port)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _ = _status(sock)
        sock.close()
        return status
    except OSError:
        return None


def _head_100kb(port: int) -> dict[str, Any]:
    sock = _connect(port)
    with contextlib.suppress(OSError):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    status, closed = _status(sock)
    sock.close()
    return {"status": status, "closed": closed}


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(5)


def _idle(port: int, n: int) -> dict[str, Any]:
    socks = []
    for _ in range(n):
        try:
            socks.append(_connect(port))
        except OSError:
            break
    time.sleep(HEAD_TIMEOUT_S + 1)
    closed = sum(_closed_by_server(s) for s in socks)
    served = _get(port)
    for s in socks:
        s.close()
    return {"opened": len(socks), "closed_by_server": closed, "new_client_status": served}


def _slowloris(port: int, limit_s: float) -> float | None:
    sock = _connect(port)
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    start = time.monotonic()
    try:
        for byte in head:
            if time.monotonic() - start > limit_s:
                return None
            sock.sendall(bytes([byte]))
            if _closed_by_server(sock):
                return round(time.monotonic() - start, 1)
            time.sleep(0.5)
    except OSError:
        return round(time.monotonic() - start, 1)
    finally:
        sock.close()
    return None


def probe(kind: str, idle: int, slow_s: float) -> dict[str, Any]:
    port = free_port()
    server = uvicorn.Server(_config(kind, port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while _get(port) != 200:
        if time.monotonic() > deadline:
            raise SystemExit(f"{kind}: the server did not start")
        time.sleep(0.1)
    try:
        return {
            "head_100kb": _head_100kb(port),
            "idle": _idle(port, idle),
            "slowloris_closed_after_s": _slowloris(port, slow_s),
        }
    finally:
        server.should_exit = True
        thread.join(15)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=1000, help="idle connections to open")
    parser.add_argument("--slow-s", type=float, default=8.0, help="how long the slow client keeps going")
    parser.add_argument("--kinds", nargs="+", default=["service", "h11", "httptools"])
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    results = {kind: probe(kind, args.idle, args.slow_s) for kind in args.kinds}
    report = {
        "uvicorn": uvicorn.__version__,
        "header_limit_bytes": HEADER_LIMIT,
        "head_timeout_s": HEAD_TIMEOUT_S,
        "connections": CONNECTIONS,
        "results": results,
    }
    rows = [
        "| configuration | 100 KB header: status | closed | idle opened | idle closed by server | new client | "
        "slowloris closed after |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, r in results.items():
        h, i = r["head_100kb"], r["idle"]
        rows.append(
            f"| {kind} | {h['status']} | {h['closed']} | {i['opened']} | {i['closed_by_server']} | "
            f"{i['new_client_status']} | {r['slowloris_closed_after_s']} |"
        )
    emit_report(report, "\n".join(rows), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
