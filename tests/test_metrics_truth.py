"""What the metrics and readiness say is what happened: a batcher that stopped on an error makes the service
unready (and /health fail); the queue-depth gauge drops when waiting clients hang up; a client that hangs up
while sending its body is a 499, not a 400; a request refused before routing counts under its route, and a path
the service has no route for under ``unmatched``. A real uvicorn server with the fake classifier."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

from service_conftest import GUARD_S, FakeClassifier, live_server


def metric(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric in Prometheus text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith(f"{name}_created"):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_batcher_stopped_on_an_error_makes_the_service_unready_and_the_server_exit() -> None:
    fatal: list[str] = []
    with live_server(classifier=FakeClassifier()) as live:
        state = live.app.state.safety
        state.on_fatal = fatal.append  # as `dialogue-safety serve` does: it stops the server
        batcher = state.served.batcher

        async def broken(*args: object, **kwargs: object) -> object:
            raise RuntimeError("a bug in the queue")

        batcher._queue.next_batch = broken  # type: ignore[method-assign]
        with live.client() as c:
            c.post("/v1/classify", json={"utterance": "hi"})  # wakes a worker: its loop ends on the error
            until(lambda: bool(fatal))
            assert c.get("/ready").status_code == 503 and c.get("/health").status_code == 503
            r = c.post("/v1/classify", json={"utterance": "hi"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_failed"
            assert metric(c.get("/metrics").text, "safety_ready") == {"": 0.0}
    assert "micro-batcher stopped" in fatal[0]


def _post_raw(port: int, body: bytes, declared: int | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    head = "POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
    s.sendall(head.encode() + str(declared or len(body)).encode() + b"\r\n\r\n" + body)
    return s


def test_the_depth_gauge_drops_when_waiting_clients_hang_up_and_a_cut_body_is_a_499() -> None:
    fake = FakeClassifier()
    with live_server(classifier=fake) as live, live.client() as c:
        fake.gate.clear()  # one request held in inference, five waiting behind it
        holder = threading.Thread(target=lambda: live.client().post("/v1/classify", json={"utterance": "hold"}))
        holder.start()
        assert fake.entered.wait(GUARD_S)
        waiting = [_post_raw(live.port, json.dumps({"utterance": f"gone {i}"}).encode()) for i in range(5)]
        until(lambda: metric(c.get("/metrics").text, "safety_queue_depth") == {"": 5.0})
        for s in waiting:
            s.close()
        until(lambda: metric(c.get("/metrics").text, "safety_queue_depth") == {"": 0.0})
        fake.gate.set()
        holder.join(GUARD_S)

        _post_raw(live.port, b'{"utterance": "hi', declared=100).close()  # the body never comes whole
        until(lambda: '{route="/v1/classify",status="499"}' in metric(c.get("/metrics").text, "safety_requests_total"))
        counted = metric(c.get("/metrics").text, "safety_requests_total")
        assert '{route="/v1/classify",status="400"}' not in counted


def test_requests_refused_before_routing_count_under_their_route_and_unknown_paths_under_unmatched() -> None:
    with live_server(classifier=FakeClassifier(), api_key="k") as live, live.client() as c:
        assert c.post("/v1/classify", json={"utterance": "hi"}).status_code == 401  # refused before routing
        assert c.post("/v1/classify", content=b"{}", headers={"Content-Encoding": "gzip"}).status_code in (401, 415)
        assert c.get("/no/such/path?x=1").status_code in (401, 404)
        counted = metric(c.get("/metrics").text, "safety_requests_total")
    assert counted['{route="/v1/classify",status="401"}'] >= 1
    assert [k for k in counted if "no/such" in k] == [] and any('route="unmatched"' in k for k in counted)


def test_a_draining_batchers_failure_leaves_the_model_now_served_alone() -> None:
    """After a hot swap, the replaced batcher failing (while it drains) does not make the service unready: the new
    model's batcher still runs. The serving batcher failing does."""
    import asyncio

    from dialogue_safety.service.settings import ServiceSettings
    from dialogue_safety.service.state import ServiceState

    fatal: list[str] = []

    async def main() -> tuple[bool, bool]:
        state = ServiceState(ServiceSettings(), lambda s: FakeClassifier(), on_fatal=fatal.append)
        await state.load()
        old = await state.install(FakeClassifier(), state.settings)
        assert old is not None and state.batcher is not None and state.batcher.running
        state._batcher_failed(RuntimeError("the old one"))  # what the old batcher's loop would call
        still_ready = state.ready
        await state.batcher.stop()  # the serving one stops: it failed
        state._batcher_failed(RuntimeError("the serving one"))
        await old.stop()
        return still_ready, state.ready

    still_ready, after = asyncio.run(main())
    assert still_ready and not after and len(fatal) == 1


def test_the_python_api_takes_a_numpy_threshold() -> None:
    import numpy as np

    from dialogue_safety.core.schema import check_threshold

    assert check_threshold(np.float32(0.5)) == 0.5 and check_threshold(np.int64(1)) == 1.0
