"""A client that pipelines a second request and hangs up is noticed by the request running: uvicorn tells only
its newest request cycle (the pipelined one), and the service's protocol (dialogue_safety/service/server.py)
tells the running one too. Its items are dropped before inference, and nothing is logged as an error."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import pytest
from service_conftest import BAD_ID, FakeClassifier, live_server

GUARD_S = 10.0


def _dropped(c: httpx.Client) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("safety_dropped_items_total "):
            return float(line.split()[-1])
    return 0.0


def test_a_pipelining_client_that_hangs_up_has_its_items_dropped_without_errors_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeClassifier()
    fake.gate.clear()  # inference held: the pipelining client's items wait in the queue
    with live_server(classifier=fake) as live, live.client() as c:
        result: dict[str, httpx.Response] = {}
        first = threading.Thread(target=lambda: result.setdefault("r", c.post("/v1/classify", json={"utterance": "a"})))
        first.start()
        assert fake.entered.wait(GUARD_S)
        body = json.dumps({"items": ["stupid idiot"] * 5}).encode()
        request = (
            b"POST /v1/classify/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        ) + body
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            with socket.create_connection(("127.0.0.1", live.port), timeout=GUARD_S) as sock:
                sock.sendall(request + request)  # the second waits behind the first on this connection
                deadline = time.monotonic() + GUARD_S
                while live.app.state.safety.gate.lane("classify").charged < 4 + 5 * 5 and time.monotonic() < deadline:
                    time.sleep(0.01)  # the first batch request is queued
            lane = live.app.state.safety.gate.lane("classify")
            deadline = time.monotonic() + GUARD_S
            while lane.charged > 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            charged = lane.charged  # the hang-up noticed while inference is still held: its charge given back
            fake.gate.set()
            first.join(GUARD_S)
            deadline = time.monotonic() + GUARD_S
            while _dropped(c) < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.5)  # what would be logged of the dropped request is by now
        assert result["r"].status_code == 200
        assert charged == 4 and _dropped(c) == 5  # dropped before inference
        assert not any(BAD_ID in e.input_ids for batch in fake.batches for e in batch)  # never predicted
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
