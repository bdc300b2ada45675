"""The HTTP API against a real uvicorn server on localhost, with a fake classifier (same interface
as OnnxClassifier): contract, limits and errors, overload, cancellation, failures, readiness,
metrics, API key. No timing assertions; every wait is bounded."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from service_conftest import BAD_ID, GUARD_S, FakeClassifier, LiveServer, live_server

from dialogue_safety.service.app import create_app
from dialogue_safety.service.settings import ServiceSettings


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier()) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def metric_lines(client: httpx.Client) -> list[str]:
    r = client.get("/metrics")
    assert r.status_code == 200
    return [line for line in r.text.splitlines() if line and not line.startswith("#")]


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


# -- contract ------------------------------------------------------------------------------------
def test_classify_contract(client: httpx.Client) -> None:
    r = client.post(
        "/v1/classify",
        json={
            "history": [{"speaker": "user", "text": "hello there"}, {"speaker": "bot", "text": "hi"}],
            "utterance": "you are an idiot",
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"label", "score", "threshold", "model", "categories", "windows"}
    assert body["windows"] == 1  # a short utterance: one window, nothing truncated
    assert body["label"] == "OFFENSIVE" and body["score"] == pytest.approx(0.9)
    assert body["threshold"] == 0.5 and body["model"] == "fake@1.2.3"
    assert set(body["categories"]) == {"offensive", "hateful"}
    assert r.headers["content-type"].startswith("application/json")


def test_history_as_strings_or_objects_and_context_matters(client: httpx.Client) -> None:
    as_strings = client.post("/v1/classify", json={"history": ["you idiot", "why"], "utterance": "fine"}).json()
    as_objects = client.post(
        "/v1/classify",
        json={"history": [{"text": "you idiot"}, {"text": "why", "speaker": "bot"}], "utterance": "fine"},
    ).json()
    mixed = client.post("/v1/classify", json={"history": [{"text": "you idiot"}, "why"], "utterance": "fine"}).json()
    alone = client.post("/v1/classify", json={"utterance": "fine"}).json()
    assert as_strings == as_objects == mixed
    assert as_strings["score"] != alone["score"]  # the history changes the score


def test_per_request_threshold(client: httpx.Client) -> None:
    low = client.post("/v1/classify", json={"utterance": "hello", "threshold": 0.05}).json()
    default = client.post("/v1/classify", json={"utterance": "hello"}).json()
    assert (low["label"], low["threshold"]) == ("OFFENSIVE", 0.05)
    assert (default["label"], default["threshold"]) == ("SAFE", 0.5)
    assert low["score"] == default["score"]


def test_batch_keeps_order_equals_single_and_applies_thresholds(client: httpx.Client) -> None:
    items: list[Any] = [
        "you idiot",
        {"utterance": "nice soup"},
        {"history": ["stupid", "idiot"], "utterance": "ok then"},
        {"history": [{"speaker": "a", "text": "hate"}], "utterance": "hi", "threshold": 0.1},
        "bye",
    ]
    r = client.post("/v1/classify/batch", json={"items": items})
    assert r.status_code == 200, r.text
    batch = r.json()
    assert set(batch) == {"results", "errors", "model"} and batch["model"] == "fake@1.2.3"
    assert batch["errors"] == 0
    singles = []
    for it in items:
        body = {"utterance": it} if isinstance(it, str) else it
        single = client.post("/v1/classify", json=body).json()
        single.pop("model")
        singles.append(single)
    assert batch["results"] == singles
    assert [res["label"] for res in batch["results"]] == ["OFFENSIVE", "SAFE", "SAFE", "OFFENSIVE", "SAFE"]

    # the batch-level threshold is the default for items without their own
    r2 = client.post("/v1/classify/batch", json={"items": items, "threshold": 0.95}).json()
    assert [res["threshold"] for res in r2["results"]] == [0.95, 0.95, 0.95, 0.1, 0.95]
    assert r2["results"][0]["label"] == "SAFE"


def test_model_card_endpoint(client: httpx.Client) -> None:
    card = client.get("/v1/model").json()
    assert card["name"] == "fake" and card["version"] == "1.2.3" and card["heads"] == ["offensive", "hateful"]
    assert card["serving"]["model"] == "fake@1.2.3" and card["serving"]["variant"] == "fp32"


def test_health_and_openapi(client: httpx.Client) -> None:
    assert client.get("/health").json()["status"] == "ok"
    assert client.get("/ready").json() == {"status": "ready", "model": "fake@1.2.3"}
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for name in ("ClassifyRequest", "BatchRequest", "ClassifyResponse", "BatchResponse"):
        assert schemas[name].get("examples"), name
    responses = spec["paths"]["/v1/classify"]["post"]["responses"]
    assert {"200", "413", "422", "429", "503"} <= set(responses)
    assert responses["422"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")


# -- limits and errors -------------------------------------------------------------------------
LIMITED: dict[str, Any] = dict(
    max_request_history_turns=2, max_turn_chars=20, max_utterance_chars=30, max_batch_items=3, max_body_bytes=1000
)


@pytest.fixture(scope="module")
def limited() -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier(), **LIMITED) as live:
        yield live


CLASSIFY, BATCH = "/v1/classify", "/v1/classify/batch"
BAD_INPUTS: list[tuple[str, str, Any, int, str, str | None]] = [
    # (case, route, json body or raw bytes, status, code, field)
    ("malformed json", CLASSIFY, b'{"utterance": ', 400, "malformed_json", None),
    ("not an object", CLASSIFY, b'["x"]', 422, "invalid_request", None),
    ("missing utterance", CLASSIFY, {"history": []}, 422, "invalid_request", "utterance"),
    ("empty utterance", CLASSIFY, {"utterance": ""}, 422, "empty_utterance", "utterance"),
    ("blank utterance", CLASSIFY, {"utterance": " \n\t"}, 422, "empty_utterance", "utterance"),
    ("utterance not a string", CLASSIFY, {"utterance": 3}, 422, "invalid_request", "utterance"),
    ("utterance too long", CLASSIFY, {"utterance": "x" * 31}, 422, "utterance_too_long", "utterance"),
    (
        "too many turns",
        CLASSIFY,
        {"history": ["a", "b", "c"], "utterance": "x"},
        422,
        "too_many_history_turns",
        "history",
    ),
    ("turn too long", CLASSIFY, {"history": ["a", "y" * 21], "utterance": "x"}, 422, "turn_too_long", "history[1]"),
    (
        "turn object too long",
        CLASSIFY,
        {"history": [{"text": "y" * 21}], "utterance": "x"},
        422,
        "turn_too_long",
        "history[0]",
    ),
    (
        "turn without text",
        CLASSIFY,
        {"history": [{"speaker": "bot"}], "utterance": "x"},
        422,
        "invalid_request",
        "history[0].text",
    ),
    ("turn of a wrong type", CLASSIFY, {"history": [5], "utterance": "x"}, 422, "invalid_request", "history[0]"),
    ("threshold above 1", CLASSIFY, {"utterance": "x", "threshold": 1.5}, 422, "invalid_threshold", "threshold"),
    ("threshold below 0", CLASSIFY, {"utterance": "x", "threshold": -0.1}, 422, "invalid_threshold", "threshold"),
    (
        "threshold not a number",
        CLASSIFY,
        {"utterance": "x", "threshold": "high"},
        422,
        "invalid_threshold",
        "threshold",
    ),
    ("unknown field", CLASSIFY, {"utterance": "x", "treshold": 0.2}, 422, "unknown_field", "treshold"),
    ("too many items", BATCH, {"items": ["a", "b", "c", "d"]}, 422, "too_many_items", "items"),
    ("no items", BATCH, {"items": []}, 422, "empty_batch", "items"),
    ("items missing", BATCH, {}, 422, "invalid_request", "items"),
    (
        "empty item string",
        BATCH,
        {"items": ["a", ""], "item_errors": "fail"},
        422,
        "empty_utterance",
        "items[1].utterance",
    ),
    (
        "item utterance too long",
        BATCH,
        {"items": ["a", {"utterance": "z" * 31}], "item_errors": "fail"},
        422,
        "utterance_too_long",
        "items[1].utterance",
    ),
    (
        "item turn too long",
        BATCH,
        {"items": [{"history": ["w" * 21], "utterance": "a"}], "item_errors": "fail"},
        422,
        "turn_too_long",
        "items[0].history[0]",
    ),
    (
        "item bad threshold",
        BATCH,
        {"items": [{"utterance": "a", "threshold": 7}], "item_errors": "fail"},
        422,
        "invalid_threshold",
        "items[0].threshold",
    ),
    ("batch bad threshold", BATCH, {"items": ["a"], "threshold": 2}, 422, "invalid_threshold", "threshold"),
    (
        "item missing utterance",
        BATCH,
        {"items": [{"history": ["a"]}], "item_errors": "fail"},
        422,
        "invalid_request",
        "items[0].utterance",
    ),
    ("body too large", CLASSIFY, {"utterance": "x", "history": ["y"] * 400}, 413, "payload_too_large", None),
]


@pytest.mark.parametrize(
    ("case", "route", "body", "status", "code", "field"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_gets_its_status_and_a_json_error(
    limited: LiveServer, case: str, route: str, body: Any, status: int, code: str, field: str | None
) -> None:
    with limited.client() as c:
        if isinstance(body, bytes):
            r = c.post(route, content=body, headers={"content-type": "application/json"})
        else:
            r = c.post(route, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code
    assert error["field"] == field
    assert error["message"]
    for text in ("x" * 31, "y" * 21, "z" * 31):
        assert text not in r.text  # error bodies never echo the texts


def test_streamed_body_over_the_limit_gets_413(limited: LiveServer) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: chunked transfer encoding, 10 MB
        yield b'{"utterance": "x", "history": ['
        for _ in range(10):
            yield b'"' + b"a" * (1024 * 1024) + b'",'
        yield b'"a"]}'

    with limited.client() as c:
        r = c.post(CLASSIFY, content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["code"] == "payload_too_large"
    # the limit, and that the body exceeded it: not the bytes read before the refusal, passed off as its size
    assert error["message"] == (
        "the request body exceeded the limit while streaming; at most 1000 bytes are accepted "
        "(SAFETY_MAX_BODY_BYTES): send fewer or shorter items per request"
    )


def test_a_declared_body_over_the_limit_is_refused_with_its_size_and_the_limit(limited: LiveServer) -> None:
    body = json.dumps({"utterance": "x", "history": ["y"] * 400}).encode()
    with limited.client() as c:
        r = c.post(CLASSIFY, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert r.json()["error"]["message"].startswith(
        f"the request body has {len(body)} bytes (Content-Length); at most 1000 bytes are accepted"
    )


def test_wrong_content_type_gets_415(limited: LiveServer) -> None:
    with limited.client() as c:
        r = c.post(CLASSIFY, content=b'{"utterance": "x"}', headers={"content-type": "text/plain"})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        # without any Content-Type the body is read as JSON
        r = c.post(CLASSIFY, content=b'{"utterance": "x"}')
        assert r.status_code == 200


def test_unknown_route_and_method_use_the_error_shape(client: httpx.Client) -> None:
    r = client.get("/v2/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.get(CLASSIFY)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


# -- overload, cancellation, failures -------------------------------------------------------------
async def _post(client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post(CLASSIFY, json=body)


def test_overload_gives_429_with_retry_after_and_then_recovers() -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    # every request here costs 4 model tokens ([CLS] [SEP] word [SEP]); one client holds half the lane: 12
    with live_server(classifier=fake, max_pending_tokens=24, max_batch_size=8) as live:

        async def scenario() -> tuple[list[httpx.Response], list[httpx.Response], list[httpx.Response]]:
            async with httpx.AsyncClient(base_url=live.url, timeout=GUARD_S) as c:
                running = asyncio.create_task(_post(c, {"utterance": "first"}))
                await asyncio.to_thread(fake.entered.wait, GUARD_S)
                queued = [asyncio.create_task(_post(c, {"utterance": f"q{i}"})) for i in range(2)]
                await asyncio.to_thread(wait_until, lambda: _depth(live) == 2, "two queued items")
                refused = [await _post(c, {"utterance": "more"}) for _ in range(3)]
                refused.append(await c.post(BATCH, json={"items": ["a", "b"]}))
                fake.gate.set()
                done = await asyncio.gather(running, *queued)
                after = [await _post(c, {"utterance": "again"}), await c.post(BATCH, json={"items": ["a", "b"]})]
                return refused, list(done), after

        refused, done, after = asyncio.run(scenario())
    for r in refused:
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "overloaded"
    assert [r.status_code for r in done] == [200, 200, 200]
    assert [r.status_code for r in after] == [200, 200]


def _depth(live: LiveServer) -> float:
    with live.client() as c:
        for line in metric_lines(c):
            if line.startswith("safety_queue_depth "):
                return float(line.split()[1])
    return -1.0


def _raw_request(port: int, body: dict[str, Any]) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=GUARD_S)
    sock.sendall(
        b"POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_a_client_that_disconnects_is_dropped_before_inference() -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    with live_server(classifier=fake) as live, live.client() as c:
        result: dict[str, httpx.Response] = {}
        first = threading.Thread(target=lambda: result.setdefault("r", c.post(CLASSIFY, json={"utterance": "a"})))
        first.start()
        assert fake.entered.wait(GUARD_S)
        # the second request queues behind the gated batch; then its client hangs up
        sock = _raw_request(live.port, {"utterance": "stupid idiot leaving"})
        wait_until(lambda: _depth(live) == 1, "the second request to be queued")
        sock.close()
        wait_until(lambda: any('status="499"' in ln for ln in metric_lines(c)), "the server to see the hang-up")
        fake.gate.set()
        first.join(GUARD_S)
        assert result["r"].status_code == 200
        assert c.post(CLASSIFY, json={"utterance": "b"}).status_code == 200
        lines = metric_lines(c)
    seen = [e for batch in fake.batches for e in batch]
    assert len(seen) == 2 and not any(BAD_ID in e.input_ids for e in seen)
    assert "safety_dropped_items_total 1.0" in lines


def test_a_failing_batch_fails_only_its_requests(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeClassifier()
    fake.fail_if = lambda batch: any(BAD_ID in e.input_ids for e in batch)
    with live_server(classifier=fake, max_batch_size=1) as live:

        async def scenario() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=live.url, timeout=GUARD_S) as c:
                return list(
                    await asyncio.gather(
                        _post(c, {"utterance": "fine"}),
                        _post(c, {"utterance": "secret idiot text"}),
                        _post(c, {"utterance": "also fine"}),
                        c.post(BATCH, json={"items": ["ok", "idiot"]}),
                    )
                )

        with caplog.at_level(logging.ERROR):
            ok1, bad, ok2, batch = asyncio.run(scenario())
        with live.client() as c:
            after = c.post(CLASSIFY, json={"utterance": "still serving"})
            failures = [ln for ln in metric_lines(c) if ln.startswith("safety_batch_failures_total")]
    assert ok1.status_code == ok2.status_code == after.status_code == 200
    assert bad.status_code == 500 and bad.json()["error"]["code"] == "inference_failed"
    assert batch.status_code == 500 and batch.json()["error"]["code"] == "inference_failed"
    assert "secret" not in bad.text and "secret" not in caplog.text
    assert failures == ["safety_batch_failures_total 2.0"]


# -- readiness -------------------------------------------------------------------------------------
def test_ready_only_after_warm_up() -> None:
    fake = FakeClassifier()
    fake.warm_gate.clear()
    with live_server(classifier=fake, wait_ready=False) as live, live.client() as c:
        assert c.get("/health").status_code == 200
        not_ready = c.get("/ready")
        assert not_ready.status_code == 503 and not_ready.headers["retry-after"] == "1"
        assert not_ready.json()["error"]["code"] == "not_ready"
        r = c.post(CLASSIFY, json={"utterance": "early"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        assert "safety_ready 0.0" in metric_lines(c)
        fake.warm_gate.set()
        live.wait_ready()
        assert fake.warmed
        assert c.post(CLASSIFY, json={"utterance": "now"}).status_code == 200
        assert "safety_ready 1.0" in metric_lines(c)


def test_a_model_that_fails_to_load_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_settings: ServiceSettings) -> FakeClassifier:
        raise FileNotFoundError("/nowhere/model.onnx: no such file")

    fatal = threading.Event()
    app = create_app(ServiceSettings(), classifier_factory=broken, on_fatal=lambda _error: fatal.set())
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "uvicorn")
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        with httpx.Client(base_url=url, timeout=GUARD_S) as c:
            wait_until(lambda: c.get("/ready").json()["error"]["code"] == "model_failed", "the load to fail")
            ready, health = c.get("/ready"), c.get("/health")
    finally:
        server.should_exit = True
        thread.join(GUARD_S)
    assert ready.status_code == health.status_code == 503
    message = ready.json()["error"]["message"]
    assert "server log" in message
    assert "nowhere" not in message and "FileNotFoundError" not in message  # no paths or exceptions for clients
    assert "/nowhere/model.onnx: no such file" in caplog.text  # the operator gets them
    assert fatal.is_set()  # the CLI stops the process on this (see test_cli_exits_when_the_model_cannot_load)


# -- metrics, auth, logging -----------------------------------------------------------------------
def test_metrics_expose_every_series(client: httpx.Client) -> None:
    client.post(CLASSIFY, json={"utterance": "you idiot"})
    client.post(BATCH, json={"items": ["a", "b"]})
    text = "\n".join(metric_lines(client))
    for series in (
        'safety_requests_total{route="/v1/classify",status="200"}',
        'safety_request_duration_seconds_bucket{le="0.005",route="/v1/classify"}',
        "safety_queue_depth ",
        "safety_queue_wait_seconds_bucket",
        "safety_batch_size_bucket",
        "safety_batch_tokens_bucket",
        "safety_inference_seconds_bucket",
        "safety_tokenization_seconds_bucket",
        'safety_predictions_total{label="OFFENSIVE"}',
        'safety_predictions_total{label="SAFE"}',
        'safety_model_info{name="fake",provider="CPUExecutionProvider",variant="fp32",version="1.2.3"} 1.0',
        "safety_ready 1.0",
        "safety_dropped_items_total",
        "safety_batch_failures_total",
    ):
        assert series in text, series


def test_api_key_is_required_when_configured() -> None:
    with live_server(classifier=FakeClassifier(), api_key="s3cret") as live, live.client() as c:
        body = {"utterance": "hello"}
        missing = c.post(CLASSIFY, json=body)
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
        assert missing.headers["www-authenticate"] == "Bearer"
        assert c.post(CLASSIFY, json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post(CLASSIFY, json=body, headers={"X-API-Key": "wrong"}).status_code == 401
        assert c.post(CLASSIFY, json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.post(CLASSIFY, json=body, headers={"X-API-Key": "s3cret"}).status_code == 200
        assert c.post(BATCH, json={"items": ["a"]}, headers={"X-API-Key": "s3cret"}).status_code == 200
        assert c.get("/v1/model").status_code == 401
        for open_route in ("/health", "/ready", "/metrics"):
            assert c.get(open_route).status_code == 200


@pytest.mark.parametrize("log_texts", [False, True])
def test_texts_are_logged_only_when_asked(log_texts: bool, caplog: pytest.LogCaptureFixture) -> None:
    with (
        live_server(classifier=FakeClassifier(), log_texts=log_texts) as live,
        live.client() as c,
        caplog.at_level(logging.DEBUG),
    ):
        c.post(CLASSIFY, json={"history": ["marker-history-1"], "utterance": "marker-utterance-2"})
        c.post(BATCH, json={"items": ["marker-batch-3"]})
    logged = caplog.text
    for marker in ("marker-history-1", "marker-utterance-2", "marker-batch-3"):
        assert (marker in logged) is log_texts


def test_settings_come_from_the_environment_when_the_app_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFETY_MAX_BATCH_ITEMS", "3")
    monkeypatch.setenv("SAFETY_API_KEY", "sup3r-secret")
    settings = ServiceSettings()
    assert settings.max_batch_items == 3 and settings.api_key is not None
    assert settings.api_key.get_secret_value() == "sup3r-secret" and "sup3r" not in repr(settings)
    app = create_app(classifier_factory=lambda s: FakeClassifier())
    assert app.state.safety.settings.max_batch_items == 3


def test_one_batching_budget_and_its_deprecated_names(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from dialogue_safety.core.batch_budget import MAX_BATCH_TOKENS

    assert ServiceSettings().max_batch_tokens == MAX_BATCH_TOKENS  # the one default
    monkeypatch.setenv("SAFETY_INFERENCE_TOKEN_BUDGET", "2048")
    monkeypatch.setenv("SAFETY_TOKEN_BUDGET", "8192")
    with caplog.at_level(logging.WARNING, logger="dialogue_safety.service.settings"):
        assert ServiceSettings().max_batch_tokens == 2048
    assert "SAFETY_INFERENCE_TOKEN_BUDGET is deprecated: use SAFETY_MAX_BATCH_TOKENS" in caplog.text
    assert "SAFETY_TOKEN_BUDGET is no longer used" in caplog.text
    monkeypatch.setenv("SAFETY_MAX_BATCH_TOKENS", "512")
    assert ServiceSettings().max_batch_tokens == 512  # the new name wins
    assert ServiceSettings(max_batch_tokens=256).max_batch_tokens == 256


def test_the_request_history_limit_is_not_the_encoding_setting(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert "max_history_turns" not in ServiceSettings.model_fields  # the card's encoding setting only
    monkeypatch.setenv("SAFETY_MAX_HISTORY_TURNS", "4")
    with caplog.at_level(logging.WARNING, logger="dialogue_safety.service.settings"):
        assert ServiceSettings().max_request_history_turns == 4
    assert "SAFETY_MAX_HISTORY_TURNS is deprecated: use SAFETY_MAX_REQUEST_HISTORY_TURNS" in caplog.text
    from dialogue_safety.core.errors import InvalidInput
    from dialogue_safety.core.limits import Limits

    with pytest.raises(InvalidInput, match="SAFETY_MAX_REQUEST_HISTORY_TURNS") as refused:
        Limits(max_request_history_turns=1).check_item("x", ["a", "b"])
    assert refused.value.code == "too_many_history_turns"
