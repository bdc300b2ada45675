"""One client's large bodies (over 64 KiB) are read one at a time, and paused after one is refused
(:class:`dialogue_safety.service.limits.LargeBodies`): what bounds the event loop's body work one client can
cause (issue 55). Behaviour only: the figures are ``python -m lab.bench abuse --attacks "million invalid,too
costly"``'s, in lab/notes/abuse.md."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from typing import Any

import httpx
import pytest
from service_conftest import GUARD_S, FakeClassifier, LiveServer, live_server

from dialogue_safety.service.json_body import StrictJsonMiddleware
from dialogue_safety.service.limits import MAX_PAUSE_S, SMALL_BODY_BYTES, LargeBodies
from lab.bench.abuse import can_bind

CLASSIFY, BATCH, MODERATIONS = "/v1/classify", "/v1/classify/batch", "/v1/moderations"
MILLION_ZEROS = json.dumps({"items": [0] * 1_000_000}, separators=(",", ":")).encode()  # 2 MB: 422 from its count
# a valid batch over SMALL_BODY_BYTES: 256 comments of 300 characters (~78 KB), answered 200
VALID_LARGE = json.dumps({"items": [("fine words " * 30)[:300]] * 256}).encode()
OTHER_ADDRESS = "127.0.0.2"  # another client, by address (what admission and these bounds charge)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _post(live: LiveServer, path: str, body: bytes, source: str | None = None) -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source) if source else None
    with httpx.Client(base_url=live.url, timeout=GUARD_S, transport=transport) as c:
        return c.post(path, content=body, headers={"content-type": "application/json"})


def _large_bodies(live: LiveServer) -> LargeBodies:
    """The running app's :class:`LargeBodies` (held by its StrictJsonMiddleware)."""
    app: Any = live.app.middleware_stack
    while app is not None and not isinstance(app, StrictJsonMiddleware):
        app = getattr(app, "app", None)
    assert app is not None, "no StrictJsonMiddleware in the app"
    return app.large_bodies


def _assert_paused(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert error["code"] == "overloaded"
    assert "SAFETY_REFUSED_BODY_SHARE" in error["message"] and str(SMALL_BODY_BYTES) in error["message"]
    assert int(r.headers["retry-after"]) >= 1
    return error


# -- the rule, on its own (a clock of the test's) ------------------------------------------------------------
def test_a_refusal_pauses_that_clients_large_bodies_for_its_share_of_the_time() -> None:
    clock = Clock()
    bodies = LargeBodies(share=0.01, clock=clock, delay_s=0.0)

    async def scenario() -> None:
        assert await bodies.start("a") is None
        bodies.refused("a", 422, 0.02)  # 20 ms of work refused: 99 x that paused
        bodies.done("a")
        refusal = await bodies.start("a")
        assert refusal is not None and refusal.headers["Retry-After"] == str(math.ceil(0.02 * 99))
        assert "(422)" in refusal.message and "20 ms" in refusal.message
        assert await bodies.start("b") is None  # another client: not paused
        bodies.done("b")
        clock.now += 0.02 * 99 + 0.001
        assert await bodies.start("a") is None  # the pause is over
        bodies.done("a")
        bodies.refused("a", 408, 3600.0)  # a body that took an hour: paused MAX_PAUSE_S at most
        clock.now += MAX_PAUSE_S + 0.001
        assert await bodies.start("a") is None

    asyncio.run(scenario())


def test_a_body_in_a_pause_waits_for_its_end_unread_or_is_refused_after_the_delay() -> None:
    bodies = LargeBodies(share=0.01, delay_s=0.05)

    async def scenario() -> None:
        bodies.refused("a", 422, 0.0003)  # paused 0.03 s, within the delay: waited out, then read
        assert await bodies.start("a") is None
        bodies.done("a")
        bodies.refused("a", 422, 10.0)  # paused 990 s: refused after the delay
        loop = asyncio.get_running_loop()
        began = loop.time()
        refusal = await bodies.start("a")
        assert refusal is not None and loop.time() - began >= 0.04
        assert "a" not in bodies.reading  # a refused body holds no place

    asyncio.run(scenario())


def test_with_a_share_of_one_nothing_is_paused() -> None:
    bodies = LargeBodies(share=1.0, clock=Clock())

    async def scenario() -> None:
        assert await bodies.start("a") is None
        bodies.refused("a", 422, 10.0)
        bodies.done("a")
        assert await bodies.start("a") is None

    asyncio.run(scenario())


def test_a_clients_second_large_body_waits_for_its_first_and_meets_its_refusal() -> None:
    bodies = LargeBodies(share=0.01, clock=Clock(), delay_s=0.0)

    async def scenario() -> None:
        assert await bodies.start("a") is None
        second = asyncio.ensure_future(bodies.start("a"))
        other = asyncio.ensure_future(bodies.start("b"))
        await asyncio.sleep(0)
        assert not second.done()  # unread while the first is being read and counted
        assert other.done() and other.result() is None  # another client's is read at once
        bodies.refused("a", 400, 0.05)
        bodies.done("a")
        refusal = await second
        assert refusal is not None and "(400)" in refusal.message
        # a first body that passes lets the next one be read
        assert await bodies.start("c") is None
        third = asyncio.ensure_future(bodies.start("c"))
        await asyncio.sleep(0)
        assert not third.done()
        bodies.done("c")
        assert await third is None

    asyncio.run(scenario())


# -- through a real server -----------------------------------------------------------------------------------
def test_after_a_refused_large_body_the_next_is_refused_429_and_small_requests_still_pass() -> None:
    with live_server(classifier=FakeClassifier(), refused_body_share=0.001) as live:
        first = _post(live, BATCH, MILLION_ZEROS)
        assert first.status_code == 422 and first.json()["error"]["code"] == "too_many_items"
        # the pause (999 x the refused body's time, at least a second here): every large body, even a valid one
        _assert_paused(_post(live, BATCH, VALID_LARGE))
        _assert_paused(_post(live, MODERATIONS, MILLION_ZEROS.replace(b"items", b"input")))
        with live.client() as c:  # the same client's small requests are served meanwhile
            assert c.post(CLASSIFY, json={"utterance": "hello there"}).status_code == 200
            assert c.get("/health").status_code == 200
        if can_bind(OTHER_ADDRESS):  # another client's large body is not paused
            other = _post(live, BATCH, VALID_LARGE, source=OTHER_ADDRESS)
            assert other.status_code == 200 and len(other.json()["results"]) == 256


def test_a_second_hostile_body_sent_while_the_first_is_read_is_refused_429() -> None:
    """One client, two connections: the first hostile body is still arriving (so being read) when the
    second comes; the second waits unread, and once the first is refused it is refused 429 (paused)."""
    with live_server(classifier=FakeClassifier(), refused_body_share=0.001) as live:
        first = socket.create_connection(("127.0.0.1", live.port), timeout=GUARD_S)
        try:
            head = (
                f"POST {BATCH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(MILLION_ZEROS)}\r\n\r\n"
            ).encode()
            first.sendall(head + MILLION_ZEROS[: SMALL_BODY_BYTES * 2])  # being read: the rest held back
            bodies = _large_bodies(live)
            deadline = time.monotonic() + GUARD_S
            while "address:127.0.0.1" not in bodies.reading:  # the first holds its client's place
                assert time.monotonic() < deadline, "the first body never took its client's place"
                time.sleep(0.01)
            answers: dict[str, httpx.Response] = {}
            second = threading.Thread(target=lambda: answers.update(r=_post(live, BATCH, MILLION_ZEROS)))
            second.start()
            second.join(0.5)
            assert second.is_alive()  # waits for the first (not read, not answered)
            first.sendall(MILLION_ZEROS[SMALL_BODY_BYTES * 2 :])
            raw = b""
            while b"\r\n\r\n" not in raw or not raw.rstrip().endswith(b"}"):
                chunk = first.recv(65536)
                assert chunk, "the server closed without an answer"
                raw += chunk
            assert raw.startswith(b"HTTP/1.1 422")
            second.join(GUARD_S)
            assert not second.is_alive()
            _assert_paused(answers["r"])
        finally:
            first.close()


def test_quiet_large_valid_bodies_are_never_refused_in_a_row_or_at_once() -> None:
    """The quiet case: one client's valid large bodies, one after another and four at once, all answered 200
    (the default share; the admission budget raised so that four such batches fit one client's share); and
    no answer is a 5xx."""
    with live_server(classifier=FakeClassifier(), max_pending_tokens=10**6) as live:
        for _ in range(3):
            r = _post(live, BATCH, VALID_LARGE)
            assert r.status_code == 200 and r.json()["errors"] == 0

        async def at_once() -> list[int]:
            async with httpx.AsyncClient(base_url=live.url, timeout=GUARD_S) as c:
                answers = await asyncio.gather(
                    *(
                        c.post(BATCH, content=VALID_LARGE, headers={"content-type": "application/json"})
                        for _ in range(4)
                    )
                )
            return [a.status_code for a in answers]

        assert asyncio.run(at_once()) == [200] * 4
        assert live.app.state.safety.gate.lanes["classify"].charged == 0
        with live.client() as c:
            metrics = c.get("/metrics").text
        assert 'status="5' not in metrics


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_the_share_is_a_fraction_of_the_time(share: float) -> None:
    from pydantic import ValidationError

    from dialogue_safety.service.settings import ServiceSettings

    with pytest.raises(ValidationError):
        ServiceSettings(refused_body_share=share)
