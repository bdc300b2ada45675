"""The hostile-client suite: the attacks of issue 14 replayed against a real uvicorn server on
localhost, with bounded counts and bounded waits (no timing assertions: speed lives in
``python -m lab.bench abuse``). Each test opens the connections it needs itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from service_conftest import GUARD_S, FakeClassifier, LiveServer, live_server, tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.service.errors import ERROR_TABLE
from dialogue_safety.service.limits import BodyGuardMiddleware
from dialogue_safety.service.server import DropQueryString
from dialogue_safety.service.settings import ServiceSettings

CLASSIFY, BATCH = "/v1/classify", "/v1/classify/batch"
TIGHT: dict[str, Any] = dict(
    max_connections=40,
    header_timeout_s=1.0,
    keep_alive_timeout_s=5.0,
    body_timeout_s=1.0,
    max_inflight_body_bytes=4000,
    max_body_bytes=3000,
)


@pytest.fixture(scope="module")
def tight() -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier(), **TIGHT) as live:
        yield live


def connect(live: LiveServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=GUARD_S)
    sock.settimeout(GUARD_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by GUARD_S)."""
    data = b""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    else:
        pytest.fail("the server kept the connection open")
    return data


def head(path: str, content_length: int | None = None, extra: str = "") -> bytes:
    length = f"Content-Length: {content_length}\r\n" if content_length is not None else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{length}{extra}\r\n"
    ).encode()


def status_and_body(raw: bytes) -> tuple[int, dict[str, Any]]:
    header, _, body = raw.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    return status, json.loads(body) if body.strip() else {}


# -- 1. idle and slow connections -------------------------------------------------------------
def test_idle_connections_are_capped_and_timed_out_while_others_are_served(
    tight: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    guard = tight.extra["guard"]
    evicted_before = guard.evicted
    idle = [connect(tight) for _ in range(TIGHT["max_connections"] + 20)]
    try:
        # at the cap, the idle connection that waited longest makes room: a new client is served
        with tight.client() as newcomer:
            assert newcomer.post(CLASSIFY, json={"utterance": "hello"}).status_code == 200
        # every idle connection is closed: to make room, or after header_timeout_s
        closed = sum(1 for sock in idle if read_until_closed(sock) == b"")
        assert closed == len(idle)
        assert guard.evicted - evicted_before >= 20 and guard.timed_out >= 1
        assert guard.open <= TIGHT["max_connections"]
    finally:
        for sock in idle:
            sock.close()
    assert "connection limit reached" in caplog.text
    with tight.client() as later:  # and clients are served as before
        assert later.post(CLASSIFY, json={"utterance": "hello"}).status_code == 200


def test_a_busy_server_at_its_connection_cap_refuses_new_connections() -> None:
    fake = FakeClassifier()
    fake.gate.clear()  # every request stays in flight: no connection is idle
    with live_server(classifier=fake, max_connections=3, header_timeout_s=5.0) as live:
        guard = live.extra["guard"]
        busy = [connect(live) for _ in range(3)]
        try:
            body = json.dumps({"utterance": "hold"}).encode()
            for sock in busy:
                sock.sendall(head(CLASSIFY, len(body)) + body)
            deadline = time.monotonic() + GUARD_S
            while guard.waiting:
                assert time.monotonic() < deadline, "the requests never started"
                time.sleep(0.01)
            extra = connect(live)
            try:
                assert read_until_closed(extra) == b""  # closed at once: nothing idle to close instead
            finally:
                extra.close()
            assert guard.refused >= 1
        finally:
            fake.gate.set()
            for sock in busy:
                sock.close()


def test_a_slowloris_head_is_cut_off(tight: LiveServer) -> None:
    sock = connect(tight)
    try:
        sock.sendall(b"POST /v1/classify HTTP/1.1\r\nHost: localhost\r\n")  # never finishes the head
        assert read_until_closed(sock) == b""
    finally:
        sock.close()


# -- 2. and 7. unfinished, slow and short bodies ---------------------------------------------------
def test_a_body_shorter_than_its_content_length_gets_408_and_the_connection_closes(tight: LiveServer) -> None:
    sock = connect(tight)
    try:
        sock.sendall(head(CLASSIFY, 100) + b'{"utterance": "hi"}')
        status, body = status_and_body(read_until_closed(sock))
    finally:
        sock.close()
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert "SAFETY_BODY_TIMEOUT_S" in body["error"]["message"]


def test_a_trickled_body_gets_408(tight: LiveServer) -> None:
    sock = connect(tight)
    try:
        sock.sendall(head(CLASSIFY, extra="Transfer-Encoding: chunked\r\n"))
        answer = b""
        for _ in range(30):  # a byte every 0.1 s: never done within body_timeout_s
            try:
                sock.sendall(b"1\r\n \r\n")
            except OSError:
                break
            time.sleep(0.1)
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert status_and_body(answer)[0] == 408


def body_guard(live: LiveServer) -> BodyGuardMiddleware:
    """The server's body guard (its ``inflight_bytes``: what the unfinished bodies hold now)."""
    layer = live.app.middleware_stack
    while not isinstance(layer, BodyGuardMiddleware):
        layer = layer.app
    return layer


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_unfinished_bodies_together_are_capped_429_at_once_small_ones_still_served() -> None:
    # the body timeout far away: what is refused is decided by the bytes held, never by how fast this runs
    budget = dict(max_body_bytes=400_000, max_inflight_body_bytes=300_000, body_timeout_s=GUARD_S)
    with live_server(classifier=FakeClassifier(), **budget) as live:
        guard = body_guard(live)
        holders = [connect(live) for _ in range(2)]
        try:
            for sock in holders:  # 2 x 120,000 declared bytes: within max_inflight_body_bytes
                sock.sendall(head(CLASSIFY, 120_000) + b'{"utterance": "')
            wait_until(lambda: guard.inflight_bytes == 240_000, "the holders' bodies were never reserved")
            extra = connect(live)
            try:
                extra.sendall(head(CLASSIFY, 120_000) + b'{"utterance": "')
                status, body = status_and_body(read_until_closed(extra))
            finally:
                extra.close()
            assert status == 429 and "SAFETY_MAX_INFLIGHT_BODY_BYTES" in body["error"]["message"]
            with live.client() as c:  # an ordinary (small) request is not refused for the big ones
                assert c.post(CLASSIFY, json={"utterance": "x" * 1000}).status_code == 200
            assert guard.inflight_bytes == 240_000
        finally:
            for sock in holders:  # the holders hang up, releasing their bytes
                sock.close()
        wait_until(lambda: guard.inflight_bytes == 0, "a hang-up did not release the bytes of its body")
        with live.client() as c:
            assert c.post(CLASSIFY, json={"utterance": "y" * 3000, "history": ["z" * 3000] * 30}).status_code == 200


def test_the_api_key_is_checked_before_the_body_is_read() -> None:
    with live_server(classifier=FakeClassifier(), api_key="s3cret", body_timeout_s=5.0) as live:
        sock = connect(live)
        try:
            sock.sendall(head(CLASSIFY, 100000))  # announces a body, sends none, no key
            status, body = status_and_body(read_until_closed(sock))
        finally:
            sock.close()
    assert status == 401 and body["error"]["code"] == "unauthorized"


@pytest.mark.parametrize("api_key", ["s3cret", None], ids=["key-set", "no-key"])
@pytest.mark.parametrize("path", ["/admin/model", "/break-it/api/admin/rounds"])
def test_admin_endpoints_are_refused_before_the_body_is_read(api_key: str | None, path: str) -> None:
    # one owner: dialogue_safety.service.auth's middleware guards the admin routers too (without a key they are off)
    with live_server(classifier=FakeClassifier(), api_key=api_key, body_timeout_s=5.0) as live:
        sock = connect(live)
        try:
            sock.sendall(head(path, 100000))  # announces a body, sends none, no key
            status, body = status_and_body(read_until_closed(sock))
        finally:
            sock.close()
    assert status == 401 and body["error"]["code"] == "unauthorized"
    assert ("SAFETY_API_KEY" in body["error"]["message"]) is (api_key is None)


def test_compressed_bodies_are_refused_with_415(tight: LiveServer) -> None:
    import gzip

    with tight.client() as c:
        r = c.post(CLASSIFY, content=gzip.compress(b'{"utterance": "hi"}'), headers={"Content-Encoding": "gzip"})
    assert r.status_code == 415 and "Content-Encoding" in r.json()["error"]["message"]


# -- 4. and 10. texts that are no text, loose types, unreadable bodies ---------------------------
RAW_CASES: list[tuple[str, bytes, int, str, str | None]] = [
    ("lone surrogate", b'{"utterance": "a\\ud800b"}', 422, "invalid_text", "utterance"),
    ("lone surrogate in history", b'{"history": ["\\udfff"], "utterance": "a"}', 422, "invalid_text", "history[0]"),
    (
        "lone surrogate in speaker",
        b'{"history": [{"speaker": "\\ud800", "text": "x"}], "utterance": "a"}',
        422,
        "invalid_text",
        "history[0].speaker",
    ),
    (
        "lone surrogate in an all-or-nothing batch",
        b'{"items": ["ok", "\\ud800"], "item_errors": "fail"}',
        422,
        "invalid_text",
        "items[1].utterance",
    ),
    ("zero-width only", '{"utterance": "\u200b\u200d\ufeff"}'.encode(), 422, "empty_utterance", "utterance"),
    ("control only", b'{"utterance": "\\u0000\\u0007"}', 422, "empty_utterance", "utterance"),
    ("threshold false", b'{"utterance": "a", "threshold": false}', 422, "invalid_threshold", "threshold"),
    ("threshold true", b'{"utterance": "a", "threshold": true}', 422, "invalid_threshold", "threshold"),
    ("threshold string", b'{"utterance": "a", "threshold": "0.5"}', 422, "invalid_threshold", "threshold"),
    (
        "item threshold false",
        b'{"items": [{"utterance": "a", "threshold": false}], "item_errors": "fail"}',
        422,
        "invalid_threshold",
        None,
    ),
    ("not UTF-8", b'{"utterance": "\xff\xfe"}', 400, "malformed_json", None),
    (
        "deep JSON",
        b'{"utterance": "a", "history": ' + b"[" * 100000 + b"]" * 100000 + b"}",
        400,
        "malformed_json",
        None,
    ),
    ("empty body", b"", 422, "invalid_request", None),
]


@pytest.mark.parametrize(("case", "raw", "status", "code", "field"), RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_bad_texts_and_bodies_get_a_4xx_saying_what_to_fix(
    case: str, raw: bytes, status: int, code: str, field: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    with live_server(classifier=FakeClassifier(), max_body_bytes=400_000) as live, live.client() as c:
        route = BATCH if raw.startswith(b'{"items"') else CLASSIFY
        r = c.post(route, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code
    if field is not None:
        assert error["field"] == field
    assert error["message"] and "There was an error parsing the body" not in error["message"]
    assert "Traceback" not in caplog.text


def test_a_lone_surrogate_in_a_batch_is_reported_in_its_slot() -> None:
    with live_server(classifier=FakeClassifier()) as live, live.client() as c:
        r = c.post(BATCH, content=b'{"items": ["ok", "\\ud800"]}', headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["errors"] == 1 and "label" in body["results"][0]
    assert body["results"][1]["error"]["code"] == "invalid_text"
    assert body["results"][1]["error"]["field"] == "items[1].utterance"


def test_integer_thresholds_stay_accepted(tight: LiveServer) -> None:
    with tight.client() as c:
        r = c.post(CLASSIFY, json={"utterance": "a", "threshold": 1})
    assert r.status_code == 200 and r.json()["threshold"] == 1


# -- 5. a client hanging up on a batch -------------------------------------------------------------
def test_a_client_hanging_up_on_a_batch_is_499_not_500(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    with live_server(classifier=fake) as live, live.client() as c:
        blocker = threading.Thread(target=lambda: c.post(CLASSIFY, json={"utterance": "first"}), daemon=True)
        blocker.start()
        assert fake.entered.wait(GUARD_S)
        body = json.dumps({"items": ["a", "b", "c"]}).encode()
        sock = connect(live)
        sock.sendall(head(BATCH, len(body)) + body)
        deadline = time.monotonic() + GUARD_S
        while live.app.state.safety.batcher.depth < 3:
            assert time.monotonic() < deadline, "the batch never reached the queue"
            time.sleep(0.01)
        sock.close()  # hang up while the batch waits
        deadline = time.monotonic() + GUARD_S
        while 'route="/v1/classify/batch",status="499"' not in c.get("/metrics").text:
            assert time.monotonic() < deadline, "the hang-up was never counted as 499"
            time.sleep(0.02)
        fake.gate.set()
        blocker.join(GUARD_S)
        metrics = c.get("/metrics").text
    assert 'status="500"' not in metrics
    assert "InvalidStateError" not in caplog.text and "Traceback" not in caplog.text


# -- 6. overload: refused from the request head, cheaply --------------------------------------------
def read_response(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One response on a keep-alive connection: status, headers (lower-case names), JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        body += chunk
    return int(lines[0].split(" ", 2)[1]), headers, json.loads(body) if body else {}


@pytest.fixture()
def overloaded() -> Iterator[tuple[LiveServer, FakeClassifier]]:
    """A server whose admission refuses this client: a held batch charges it its whole fair share
    (4 model tokens of a classify lane of 8, shared by at least two)."""
    fake = FakeClassifier()
    with live_server(classifier=fake, max_pending_tokens=8, api_key="s3cret") as live:
        key = {"X-API-Key": "s3cret"}
        with live.client(headers=key) as c, live.client(headers=key) as held:
            assert c.post(CLASSIFY, json={"utterance": "f"}).status_code == 200  # can cost 4: one request's most
            fake.gate.clear()
            fake.entered.clear()
            blocker = threading.Thread(target=lambda: held.post(CLASSIFY, json={"utterance": "h"}), daemon=True)
            blocker.start()
            assert fake.entered.wait(GUARD_S)
            assert live.app.state.safety.gate.refusal("address:127.0.0.1") is not None
            try:
                yield live, fake
            finally:
                fake.gate.set()
                blocker.join(GUARD_S)


def test_an_overloaded_service_answers_429_before_the_body_and_keeps_the_connection(
    overloaded: tuple[LiveServer, FakeClassifier],
) -> None:
    live, fake = overloaded
    body = json.dumps({"utterance": "you are an idiot"}).encode()
    sock = connect(live)
    try:
        sock.sendall(head(CLASSIFY, len(body), "X-API-Key: s3cret\r\n"))  # the head only: no body sent
        status, headers, error = read_response(sock)
        assert status == 429 and error["error"]["code"] == "overloaded"
        assert "fair share" in error["error"]["message"] and headers["retry-after"] == "1"
        assert headers["content-type"] == "application/json" and "connection" not in headers
        # the body comes late: it is skipped, and the connection serves the next request
        sock.sendall(body + b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        status, _, health = read_response(sock)
        assert status == 200 and health["status"] == "ok"
    finally:
        sock.close()
    with live.client() as c:
        metrics = c.get("/metrics").text
    assert 'safety_requests_total{route="/v1/classify",status="429"} 1.0' in metrics
    assert fake.batches == [fake.batches[0]]  # only the first request reached the model


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        ("/v1/moderations", {"input": "you are an idiot"}),
        ("/v1/classify/conversation", {"turns": ["hi", "you are an idiot"]}),
    ],
)
def test_every_endpoint_that_reaches_the_model_gets_the_early_429(
    overloaded: tuple[LiveServer, FakeClassifier], path: str, sent: dict[str, Any]
) -> None:
    live, fake = overloaded
    body = json.dumps(sent).encode()
    sock = connect(live)
    try:
        sock.sendall(head(path, len(body), "X-API-Key: s3cret\r\n"))  # the head only: no body sent
        status, headers, error = read_response(sock)
        assert status == 429 and headers["retry-after"] == "1" and "connection" not in headers
        if path == "/v1/moderations":  # in OpenAI's shape, as every error of that endpoint
            assert error["error"]["type"] == "requests" and error["error"]["code"] == "overloaded"
        else:
            assert error["error"]["code"] == "overloaded"
        assert "fair share" in error["error"]["message"]
        sock.sendall(body + b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")  # skipped; the connection serves on
        status, _, health = read_response(sock)
        assert status == 200 and health["status"] == "ok"
    finally:
        sock.close()
    with live.client() as c:
        assert f'safety_requests_total{{route="{path}",status="429"}} 1.0' in c.get("/metrics").text
    assert fake.batches == [fake.batches[0]]  # only the first request reached the model


def test_overload_does_not_hide_a_wrong_api_key(overloaded: tuple[LiveServer, FakeClassifier]) -> None:
    live, _ = overloaded
    with live.client(headers={"X-API-Key": "wrong"}) as c:
        response = c.post(CLASSIFY, json={"utterance": "hi"})
    assert response.status_code == 401


def test_requests_that_end_before_being_queued_hold_no_charge() -> None:
    with live_server(classifier=FakeClassifier()) as live, live.client() as c:
        assert c.post(CLASSIFY, json={"utterance": "first"}).status_code == 200
        assert c.post(CLASSIFY, json={"utterance": ""}).status_code == 422  # refused before encoding
        assert c.post(CLASSIFY, content=b"{not json").status_code == 400
        assert c.post(BATCH, json={"items": [""]}).status_code == 200  # every item refused in its slot
        assert c.post(CLASSIFY, json={"utterance": "again"}).status_code == 200
        lanes = live.app.state.safety.gate.lanes
        assert all(lane.charged == 0 and not lane.clients for lane in lanes.values())


# -- 3. one large valid request does not stall the server (real tokenizer) ------------------------
def test_largest_allowed_requests_are_served_while_health_answers(tiny_model_dir: Path) -> None:  # noqa: F811
    big = {"history": ["🤬" * 4000] * 32, "utterance": "🤬" * 4000}
    # 4,000 emoji are read as their names: ~200 windows, far past the default cap (32, too_many_windows);
    # the cap raised so that the largest texts the character limits allow are read whole, every window, and
    # the admission budget raised to admit four of them (by default one is refused: request_too_costly)
    with live_server(model_dir=tiny_model_dir, max_pending_tokens=10**7, max_windows=1000) as live:

        async def scenario() -> tuple[list[int], list[int]]:
            async with httpx.AsyncClient(base_url=live.url, timeout=GUARD_S * 3) as c:
                heavy = [asyncio.create_task(c.post(CLASSIFY, json=big)) for _ in range(4)]
                probes = []
                while not all(t.done() for t in heavy):
                    probes.append((await c.get("/health")).status_code)
                    await asyncio.sleep(0.01)
                return [(await t).status_code for t in heavy], probes

        heavy, probes = asyncio.run(scenario())
    assert heavy == [200] * 4
    assert probes and set(probes) == {200}


# -- 8. startup faults --------------------------------------------------------------------------
def test_the_cli_exits_when_the_model_cannot_load(tiny_model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    import shutil
    import subprocess
    import sys

    broken = tmp_path / "broken_model"
    shutil.copytree(tiny_model_dir, broken)
    for onnx_file in broken.glob("*.onnx"):
        onnx_file.write_bytes(b"not an onnx graph")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dialogue_safety.service.cli",
            "--model",
            str(broken),
            "--port",
            "0",
            "--log-level",
            "warning",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "failed to load" in proc.stderr


def test_a_read_only_model_dir_error_says_which_setting_fixes_it(
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dialogue_safety.core import variants
    from dialogue_safety.core.variants import cache as variant_cache

    monkeypatch.setattr(variant_cache, "writable", lambda _directory: False)  # as for a non-root user
    monkeypatch.setenv("DIALOGUE_SAFETY_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(variants.VariantError, match="DIALOGUE_SAFETY_CACHE_DIR"):
        variants.ensure_variant(tiny_model_dir, "int8")


# -- 9. authentication ------------------------------------------------------------------------------
def test_an_empty_api_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFETY_API_KEY", "")
    with pytest.raises(ValidationError, match="SAFETY_API_KEY is set but empty"):
        ServiceSettings()
    monkeypatch.setenv("SAFETY_API_KEY", "   ")
    with pytest.raises(ValidationError):
        ServiceSettings()


@pytest.mark.parametrize("public_docs", [False, True])
def test_docs_follow_the_api_key_and_auth_state_is_logged(public_docs: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dialogue_safety.service.auth")
    with (
        live_server(classifier=FakeClassifier(), api_key="s3cret", public_docs=public_docs) as live,
        live.client() as c,
    ):
        open_status = {path: c.get(path).status_code for path in ("/docs", "/redoc", "/openapi.json")}
        keyed = {path: c.get(path, headers={"X-API-Key": "s3cret"}).status_code for path in open_status}
        assert c.get("/health").status_code == 200
    assert set(keyed.values()) == {200}
    assert set(open_status.values()) == ({200} if public_docs else {401})
    assert "authentication is on" in caplog.text and "s3cret" not in caplog.text


def test_running_without_a_key_is_logged_loudly(caplog: pytest.LogCaptureFixture) -> None:
    with live_server(classifier=FakeClassifier()):
        pass
    assert "authentication is OFF" in caplog.text


# -- 11. access log ----------------------------------------------------------------------------
def test_the_access_log_drops_query_strings() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("1.2.3.4:5", "GET", "/x?key=1", "1.1", 200),
        None,
    )
    assert DropQueryString().filter(record)
    assert record.getMessage() == '1.2.3.4:5 - "GET /x HTTP/1.1" 200'


# -- the contract: one error table, the doc, the schema -------------------------------------------
def test_docs_api_md_lists_exactly_the_error_table() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    section = doc.split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = {
        (int(cells[0]), cells[1].strip("`"))
        for line in section.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])[0].isdigit()
    }
    table = {(row.status, code) for row in ERROR_TABLE for code in row.all_codes}
    assert rows == table


def test_openapi_declares_the_enforced_limits(tight: LiveServer) -> None:
    with tight.client() as c:
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
    utterance = schemas["ClassifyRequest"]["properties"]["utterance"]
    assert utterance["minLength"] == 1 and utterance["maxLength"] == 4000 and utterance["pattern"]
    assert schemas["ClassifyRequest"]["properties"]["history"]["maxItems"] == 32
    assert schemas["BatchRequest"]["properties"]["items"]["minItems"] == 1
    assert schemas["BatchRequest"]["properties"]["items"]["maxItems"] == 256
    assert schemas["TurnIn"]["properties"]["text"]["maxLength"] == 4000


# -- round two: HTTP edges ---------------------------------------------------------------------------
def raw_exchange(live: LiveServer, request: bytes) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Send ``request`` as it is on a fresh connection; the answer's status, headers and JSON body (the
    connection must end: every refusal below closes it)."""
    sock = connect(live)
    try:
        with contextlib.suppress(OSError):  # closed while sending (a refused head): the answer was written first
            sock.sendall(request)
        raw = read_until_closed(sock)
    finally:
        sock.close()
    header, _, body = raw.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert headers.get("content-type") == "application/json", raw[:300]
    return int(lines[0].split(" ", 2)[1]), headers, json.loads(body)


def test_no_redirect_is_built_from_the_host_header(tight: LiveServer) -> None:
    """`POST /v1/classify/` used to redirect to http://<Host header>/v1/classify: an open redirect."""
    for path in (CLASSIFY + "/", "/health/", "/v1/model/"):
        request = f"GET {path} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n".encode()
        status, headers, body = raw_exchange(tight, request)
        assert status == 404 and "location" not in headers and body["error"]["code"] == "not_found", (path, headers)
    with tight.client() as c:
        r = c.post(CLASSIFY + "/", json={"utterance": "hi"}, headers={"Host": "evil.example"})
        assert r.status_code == 404 and "location" not in r.headers and "evil" not in r.text


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"utterance": "have a nice day", "utterance": "you idiot"}', "duplicate_key"),
        (b'{"items": [{"utterance": "a", "history": [{"text": "x", "text": "y"}]}]}', "duplicate_key"),
        (b'{"utterance": "a", "threshold": ' + b"[" * 1400 + b"]" * 1400 + b"}", "malformed_json"),
        (b'{"utterance": "a", "history": ' + b"[" * 65 + b"]" * 65 + b"}", "malformed_json"),
    ],
    ids=["duplicate key", "duplicate key in a turn", "1,400 deep", "65 deep"],
)
def test_duplicate_keys_and_deep_bodies_are_refused_400(tight: LiveServer, raw: bytes, code: str) -> None:
    """A proxy that checks the first `utterance` must not see another text than the model is asked about."""
    with tight.client() as c:
        route = BATCH if raw.startswith(b'{"items"') else CLASSIFY
        r = c.post(route, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
        if code == "duplicate_key":
            assert "appears twice" in r.json()["error"]["message"]
        # the same key in two different objects is not a duplicate; a chunked body is read whole
        ok = c.post(CLASSIFY, content=b'{"utterance": "a", "history": [{"text": "b"}, {"text": "c"}]}')
        assert ok.status_code == 200, ok.text
        chunked = c.post(CLASSIFY, content=iter([b'{"utterance": "a", ', b'"utterance": "b"}']))
        assert chunked.status_code == 400 and chunked.json()["error"]["code"] == "duplicate_key"


@pytest.fixture(scope="module")
def small_heads() -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier(), header_timeout_s=GUARD_S, max_header_bytes=4096) as live:
        yield live


def test_a_request_head_over_the_limit_gets_431_and_is_never_held_whole(small_heads: LiveServer) -> None:
    guard = small_heads.extra["guard"]
    assert guard.max_header_bytes == 4096
    big = f"POST {CLASSIFY} HTTP/1.1\r\nHost: localhost\r\nX-Big: {'a' * 5000}\r\nContent-Length: 2\r\n\r\n{{}}"
    status, _, body = raw_exchange(small_heads, big.encode())
    assert status == 431 and body["error"]["code"] == "header_too_large"
    assert "SAFETY_MAX_HEADER_BYTES" in body["error"]["message"]
    # a head that never ends, sent in pieces: refused once past the limit, not when the head timeout ends
    # (counted, not timed: the head timeout closes without an answer and counts in guard.timed_out)
    timed_out, refused = guard.timed_out, guard.refused_heads
    sock = connect(small_heads)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        answer = b""
        for i in range(200):
            try:
                sock.sendall(f"X-Header-{i}: {'b' * 100}\r\n".encode())
            except OSError:
                break
        answer = read_until_closed(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert (guard.timed_out, guard.refused_heads) == (timed_out, refused + 1)
    # many headers that fit are served
    with small_heads.client() as c:
        assert c.get("/health", headers={f"X-H{i}": "v" * 50 for i in range(40)}).status_code == 200


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nBad Header Name: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
        b"GET /he\x01alth HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ],
    ids=[
        "request line",
        "version",
        "header name",
        "NUL in a value",
        "control in the path",
        "content-length",
        "chunk size",
        "two lengths",
    ],
)
def test_what_the_http_parser_refuses_is_answered_in_the_json_error_shape(
    tight: LiveServer, request_bytes: bytes
) -> None:
    status, headers, body = raw_exchange(tight, request_bytes)
    assert status == 400 and body["error"]["code"] == "malformed_request", body
    assert headers.get("connection") == "close"


def test_docs_api_md_lists_every_limit() -> None:
    """The limits table names every limit setting (SAFETY_MAX_*, the timeouts, the queue) with its
    default, and the fixed limits with their values."""
    from dialogue_safety.breakit.game import MAX_ID
    from dialogue_safety.core.json_input import MAX_JSON_DEPTH

    doc = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    table = doc.split("## Limits", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    limit_settings = [
        name
        for name in ServiceSettings.model_fields
        if (name.startswith("max_") and name not in {"max_batch_size", "max_batch_tokens", "max_wait_ms"})
        or name.endswith("_timeout_s")
    ]
    defaults = ServiceSettings()
    for name in limit_settings:
        row = next((r for r in rows if f"`SAFETY_{name.upper()}`" in r), f"SAFETY_{name.upper()} is not listed")
        default = getattr(defaults, name)
        if default is not None:  # (unset: measured at start)
            value = str(int(default)) if float(default).is_integer() else str(default)
            assert value in row.split("|")[2], (name, default, row)
    assert any("`MAX_JSON_DEPTH`" in r and f"{MAX_JSON_DEPTH} levels" in r for r in rows)
    assert any("`MAX_ID`" in r and str(MAX_ID) in r for r in rows)


def test_a_websocket_handshake_gets_a_json_answer(tight: LiveServer) -> None:
    """The service has no WebSocket route: uvicorn's WebSocket layer used to refuse the handshake with a
    bare plain-text 403; it is an ordinary request now."""
    handshake = (
        f"GET {CLASSIFY} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade, close\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    status, _, body = raw_exchange(tight, handshake)
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
