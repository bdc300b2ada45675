"""The service end to end with the real runtime: the tiny checkpoint exported to ONNX, served by
uvicorn on localhost. Checks that HTTP answers equal the in-process OnnxClassifier."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_conftest import LiveServer, live_server, tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example, Turn

DIALOGUES: list[dict[str, Any]] = [
    {
        "history": [{"speaker": "user", "text": "what do you think of my neighbours?"}, "they are loud"],
        "utterance": "they should all be thrown out",
    },
    {"utterance": "have a nice day"},
    {"history": ["hi", "hello there", "how are you"], "utterance": "you are an idiot", "threshold": 0.2},
    {"history": ["🐍 snakes everywhere"], "utterance": "go back where you came from 🤬"},
]


def as_example(d: dict[str, Any]) -> Example:
    turns = tuple(Turn(h) if isinstance(h, str) else Turn(h["text"], h.get("speaker")) for h in d.get("history", []))
    return Example(utterance=str(d["utterance"]), history=turns)


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:  # noqa: F811
    with live_server(model_dir=tiny_model_dir, max_wait_ms=1.0) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_answers_equal_the_runtime_single_and_batched(client: httpx.Client, tiny_model_dir: Path) -> None:  # noqa: F811
    runtime = OnnxClassifier(tiny_model_dir)
    card = ModelCard.load(tiny_model_dir)
    expected = runtime.predict([as_example(d) for d in DIALOGUES])
    singles = [client.post("/v1/classify", json=d) for d in DIALOGUES]
    assert all(r.status_code == 200 for r in singles), [r.text for r in singles]
    batch = client.post("/v1/classify/batch", json={"items": DIALOGUES})
    assert batch.status_code == 200, batch.text
    assert batch.json()["model"] == card.model_id == "tiny-random@0.0.1"
    for d, single, result, want in zip(DIALOGUES, singles, batch.json()["results"], expected, strict=True):
        body = single.json()
        assert body["model"] == card.model_id
        assert body["score"] == pytest.approx(want.score, abs=1e-5)
        assert result["score"] == pytest.approx(body["score"], abs=1e-6)
        threshold = d.get("threshold", card.threshold)
        assert body["threshold"] == result["threshold"] == threshold
        assert body["label"] == ("OFFENSIVE" if body["score"] >= threshold else "SAFE")
        assert set(body["categories"]) == set(card.heads)


def test_model_card_ready_and_metrics(client: httpx.Client, tiny_model_dir: Path) -> None:  # noqa: F811
    card = client.get("/v1/model").json()
    assert card["name"] == "tiny-random" and card["serving"]["provider"] == "CPUExecutionProvider"
    assert client.get("/ready").json() == {"status": "ready", "model": "tiny-random@0.0.1"}
    client.post("/v1/classify", json={"utterance": "hello"})
    metrics = client.get("/metrics").text
    assert (
        'safety_model_info{name="tiny-random",provider="CPUExecutionProvider",variant="fp32",version="0.0.1"}'
        in metrics
    )
    assert "safety_batch_tokens_count" in metrics and "safety_ready 1.0" in metrics


def test_long_inputs_within_limits_are_read_in_windows_not_refused(client: httpx.Client) -> None:
    r = client.post("/v1/classify", json={"history": ["word " * 700] * 3, "utterance": "really " * 500})
    assert r.status_code == 200, r.text
    body = r.json()
    # every word of the utterance is read, in windows; the history budget beside it dropped the older turns
    assert body["windows"] > 1
    assert body["truncated"] == {"utterance_chars_unread": 0, "history_turns_dropped": 2}
    short = client.post("/v1/classify", json={"history": ["hi"], "utterance": "really"}).json()
    assert short["windows"] == 1 and "truncated" not in short


LONG_INSULT = " ".join(["you are a very stupid idiot and i hate you because you are"] * 30)


def test_the_answer_equals_the_runtime_for_long_messages_single_and_batched(
    client: httpx.Client,
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    items = [{"utterance": LONG_INSULT}, {"history": ["hi", "hello"], "utterance": LONG_INSULT[:1500]}, "hello"]
    runtime = OnnxClassifier(tiny_model_dir)
    expected = runtime.predict([as_example(d) if isinstance(d, dict) else Example(utterance=d) for d in items])
    batch = client.post("/v1/classify/batch", json={"items": items}).json()["results"]
    for item, result, want in zip(items, batch, expected, strict=True):
        single = client.post("/v1/classify", json=item if isinstance(item, dict) else {"utterance": item}).json()
        for got in (single, result):
            assert got["score"] == pytest.approx(want.score, abs=1e-5)
            assert got["windows"] == want.read.windows
    assert batch[0]["windows"] > 1


def test_language_is_said_and_counted(client: httpx.Client) -> None:
    fr = client.post("/v1/classify", json={"utterance": "va te faire foutre espèce de con, tu ne comprends rien"})
    en = client.post("/v1/classify", json={"utterance": "you are a clown and everyone laughs at you"})
    assert fr.status_code == en.status_code == 200
    assert fr.json()["language"] == "fr" and fr.json()["language_supported"] is False
    assert en.json()["language"] == "en" and en.json()["language_supported"] is True
    assert fr.json()["label"] in {"SAFE", "OFFENSIVE"}  # the verdict is still given
    metrics = client.get("/metrics").text
    assert 'safety_unsupported_language_items_total{language="fr"}' in metrics
    assert "safety_item_windows_bucket" in metrics


def _batched_rows(c: httpx.Client) -> float:
    """Rows the served model has run inference on (the sum of the batch-size histogram)."""
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("safety_batch_size_sum "):
            return float(line.split()[1])
    raise AssertionError("safety_batch_size_sum missing from /metrics")


def test_more_windows_than_the_cap_is_refused_with_its_own_error(tiny_model_dir: Path) -> None:  # noqa: F811
    settings = {"max_wait_ms": 1.0, "max_windows": 2, "language_check": False}
    with live_server(model_dir=tiny_model_dir, **settings) as live, live.client() as c:
        inferred = _batched_rows(c)
        r = c.post("/v1/classify", json={"utterance": LONG_INSULT})
        assert r.status_code == 422, r.text
        assert _batched_rows(c) == inferred  # refused once encoded: no inference paid for it
        error = r.json()["error"]
        assert error["code"] == "too_many_windows" and error["field"] == "utterance"
        assert "SAFETY_MAX_WINDOWS" in error["message"] and "at most 2" in error["message"]
        batch = c.post("/v1/classify/batch", json={"items": ["hello", LONG_INSULT, LONG_INSULT[:300]]})
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert results[1]["error"]["code"] == "too_many_windows"
        assert results[1]["error"]["field"] == "items[1].utterance"
        assert results[0]["windows"] == 1 and results[2]["windows"] <= 2 and batch.json()["errors"] == 1
        # the refused item never reached a batch: only the rows of the other two did (their windows)
        assert _batched_rows(c) == inferred + results[0]["windows"] + results[2]["windows"]
        assert "language" not in results[0]  # the language check is off
        failing = c.post("/v1/classify/batch", json={"items": ["hello", LONG_INSULT], "item_errors": "fail"})
        assert failing.status_code == 422 and failing.json()["error"]["code"] == "too_many_windows"
        schema = c.get("/openapi.json").json()["components"]["schemas"]
        fields = set(schema["Classification"]["properties"])
        assert {"windows", "truncated", "language", "language_supported"} <= fields
        assert set(schema["Truncation"]["properties"]) == {"utterance_chars_unread", "history_turns_dropped"}
