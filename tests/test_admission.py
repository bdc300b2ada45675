"""Admission by cost, against a real uvicorn server: what a request is charged (tokens x windows x
passes, every sequence of an explanation) on the tiny exported model, the 413 of a request larger than
its lane allows, fair share between clients (told apart by address: 127.0.0.1 and 127.0.0.2), the
explain lane apart from the classify lane, hung-up clients dropped before inference, and the 429 with
Retry-After answered before the body is read. Every wait is bounded; no timing assertions."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_conftest import BAD_ID, GUARD_S, FakeClassifier, LiveServer, live_server, tiny_model_dir  # noqa: F401

from dialogue_safety.core import explain
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.schema import Example, Turn

CLASSIFY, BATCH = "/v1/classify", "/v1/classify/batch"


def metric(c: httpx.Client, name: str, **labels: str) -> float:
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in c.get("/metrics").text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def from_address(live: LiveServer, address: str) -> httpx.AsyncClient:
    """A client whose connections come from ``address`` (another client to admission)."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    return httpx.AsyncClient(base_url=live.url, timeout=GUARD_S, transport=transport)


def model_tokens(e: EncodedExample) -> int:
    """tokens x windows x passes, counted here from the rows themselves."""
    own = sum(len(window) for window in (e, *e.more))
    return own + (model_tokens(e.alone) if e.alone is not None else 0)


# -- the cost of a request, on the tiny exported model ------------------------------------------------------
def test_a_request_is_charged_tokens_times_windows_times_passes_and_an_explanation_every_sequence(
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    from dialogue_safety.core.runtime import OnnxClassifier

    clf = OnnxClassifier(tiny_model_dir)
    long_one = Example(utterance=" ".join(f"word{i % 50}" for i in range(450)))  # several windows, under 4,000 chars
    dialogue = Example(utterance="you are an idiot", history=(Turn("hello there"), Turn("how are you")))
    [long_enc, dialogue_enc] = clf.encode([long_one, dialogue])
    assert len(long_enc.rows) > 1  # the windows are charged
    cost = model_tokens(long_enc) + model_tokens(dialogue_enc)
    with live_server(model_dir=tiny_model_dir, max_windows=1000) as live, live.client() as c:
        items = [long_one.utterance, {"utterance": dialogue.utterance, "history": [t.text for t in dialogue.history]}]
        r = c.post(BATCH, json={"items": items})
        assert r.status_code == 200 and r.json()["errors"] == 0, r.text
        assert metric(c, "safety_request_cost_tokens_sum", lane="classify") == cost
        serving = c.get("/v1/model").json()["serving"]["admission"]
        # an explanation: as many sequences as half the explain lane holds at the example's cost
        r = c.post(CLASSIFY, json={"utterance": dialogue.utterance, "explain": True})
        assert r.status_code == 200, r.text
        explained = metric(c, "safety_request_cost_tokens_sum", lane="explain")
        assert metric(c, "safety_request_cost_tokens_sum", lane="classify") == cost  # not the classify lane
        assert metric(c, "safety_admission_charged_tokens", lane="classify") == 0  # everything answered
    alone = Example(utterance=dialogue.utterance)
    [alone_enc] = clf.encode([alone])
    plan = explain.plan_within(alone, serving["explain"]["max_request_tokens"] // alone_enc.tokens)
    assert explained == sum(model_tokens(e) for e in clf.encode(plan.examples())) > alone_enc.tokens
    assert serving["classify"]["budget_tokens"] == 65_536 and serving["classify"]["max_request_tokens"] == 32_768


# -- limits and refusals, with the fake classifier (4 model tokens a one-word request) --------------------
def test_a_request_larger_than_half_its_lane_is_refused_413_naming_the_limit() -> None:
    with live_server(classifier=FakeClassifier(), max_pending_tokens=40) as live, live.client() as c:
        # refused on its real cost (3 x (6 words + 3)): the fake's tokenizer tells no lower bound
        r = c.post(BATCH, json={"items": ["one two three four five six"] * 3})
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["code"] == "request_too_costly"
        assert "costs 27 model tokens" in error["message"] and "at most 20" in error["message"]
        assert "SAFETY_MAX_PENDING_TOKENS (40)" in error["message"]
        assert c.post(BATCH, json={"items": ["one two"] * 2}).status_code == 200  # costs 2 x 5
        assert metric(c, "safety_admission_refused_total", lane="classify", reason="too_costly") == 1


def test_while_one_client_holds_its_fair_share_another_client_is_admitted() -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    with live_server(classifier=fake, max_pending_tokens=24, max_batch_size=8) as live, live.client() as c:

        async def scenario() -> tuple[list[int], int, list[int]]:
            async with from_address(live, "127.0.0.1") as greedy, from_address(live, "127.0.0.2") as other:
                held = [asyncio.create_task(greedy.post(CLASSIFY, json={"utterance": f"w{i}"})) for i in range(3)]
                await asyncio.to_thread(
                    wait_until, lambda: metric(c, "safety_admission_charged_tokens", lane="classify") == 12, "12"
                )
                over = await greedy.post(CLASSIFY, json={"utterance": "more"})  # its share: 24 / 2
                polite = asyncio.create_task(other.post(CLASSIFY, json={"utterance": "mine"}))
                await asyncio.to_thread(
                    wait_until, lambda: metric(c, "safety_admission_charged_tokens", lane="classify") == 16, "16"
                )
                fake.gate.set()
                answered = [r.status_code for r in await asyncio.gather(*held)]
                return answered, over.status_code, [(await polite).status_code]

        answered, over, polite = asyncio.run(scenario())
        assert metric(c, "safety_admission_refused_total", lane="classify", reason="fair_share") == 1
    assert answered == [200, 200, 200] and over == 429 and polite == [200]


def test_an_explanation_is_charged_to_its_own_lane_not_the_classify_lane() -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    with live_server(classifier=fake, max_pending_tokens=8, max_batch_size=64) as live, live.client() as c:
        result: dict[str, httpx.Response] = {}
        words = " ".join(f"w{i}" for i in range(8))
        thread = threading.Thread(
            target=lambda: result.setdefault("r", c.post(CLASSIFY, json={"utterance": words, "explain": True}))
        )
        thread.start()
        assert fake.entered.wait(GUARD_S)
        explained = metric(c, "safety_admission_charged_tokens", lane="explain")
        classify_charged = metric(c, "safety_admission_charged_tokens", lane="classify")
        # the classify lane (8 tokens: 4 for this client) still admits this client while it explains
        plain = threading.Thread(target=lambda: result.setdefault("plain", c.post(CLASSIFY, json={"utterance": "p"})))
        plain.start()
        wait_until(lambda: metric(c, "safety_admission_charged_tokens", lane="classify") == 4, "plain admitted")
        fake.gate.set()
        thread.join(GUARD_S)
        plain.join(GUARD_S)
        assert result["plain"].status_code == 200
        assert result["r"].status_code == 200 and result["r"].json()["explanation"]["utterance"]
    assert explained > 8 and classify_charged == 0  # more than the whole classify lane, charged elsewhere


def test_a_client_that_hangs_up_has_its_items_dropped_and_its_charge_given_back() -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    with live_server(classifier=fake) as live, live.client() as c:

        async def scenario() -> tuple[float, float]:
            async with from_address(live, "127.0.0.1") as first, from_address(live, "127.0.0.2") as leaving:
                running = asyncio.create_task(first.post(CLASSIFY, json={"utterance": "a"}))
                await asyncio.to_thread(fake.entered.wait, GUARD_S)
                gone = asyncio.create_task(leaving.post(BATCH, json={"items": ["stupid idiot"] * 5}))
                await asyncio.to_thread(
                    wait_until, lambda: metric(c, "safety_admission_charged_tokens", lane="classify") == 4 + 25, "29"
                )
                gone.cancel()  # the client hangs up before its batch runs
                await asyncio.gather(gone, return_exceptions=True)
                await asyncio.to_thread(
                    wait_until, lambda: metric(c, "safety_admission_charged_tokens", lane="classify") == 4, "4"
                )
                after = metric(c, "safety_admission_charged_tokens", lane="classify")
                fake.gate.set()
                assert (await running).status_code == 200
                return after, metric(c, "safety_dropped_items_total")

        charged_after, dropped = asyncio.run(scenario())
        wait_until(lambda: metric(c, "safety_dropped_items_total") == 5, "the dropped items to be reached")
    assert charged_after == 4
    assert not any(BAD_ID in e.input_ids for batch in fake.batches for e in batch)  # never predicted


def test_overload_is_answered_429_with_retry_after_before_the_body_is_read() -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    with live_server(classifier=fake, max_pending_tokens=8) as live, live.client() as c:
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.setdefault("r", c.post(CLASSIFY, json={"utterance": "a"})))
        thread.start()
        assert fake.entered.wait(GUARD_S)  # 4 of this client's 4 tokens (8 / 2) are held
        # a declared body that never comes: answered from the head, not after body_timeout_s
        with socket.create_connection(("127.0.0.1", live.port), timeout=GUARD_S) as sock:
            sock.sendall(
                b"POST /v1/classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"utterance": "b"'
            )
            answer = sock.recv(65536)
        fake.gate.set()
        thread.join(GUARD_S)
        assert result["r"].status_code == 200
    head = answer.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 429") and b"retry-after: 1" in head and b"fair share" in answer


def test_break_it_players_are_charged_apart_whatever_their_address(tmp_path: Path) -> None:
    key = {"Authorization": "Bearer k3y"}
    fake = FakeClassifier()
    settings = {"breakit_db": str(tmp_path / "game.sqlite3"), "api_key": "k3y", "max_pending_tokens": 32}
    with live_server(classifier=fake, **settings) as live, live.client() as c:
        rates = {"score": {"player": "1000/minute"}}
        assert c.post("/break-it/api/admin/rounds", json={"number": 1, "rates": rates}, headers=key).status_code == 200
        players = c.post("/break-it/api/admin/players", json={"nicknames": ["ann", "ben"]}, headers=key).json()
        ann, ben = ({"X-Player-Token": p["token"]} for p in players["players"])
        lane = live.app.state.safety.gate.lane("classify")
        fake.gate.clear()
        result: dict[str, httpx.Response] = {}

        def score(name: str, who: dict[str, str], text: str) -> threading.Thread:
            thread = threading.Thread(
                target=lambda: result.setdefault(
                    name, c.post("/break-it/api/score", json={"utterance": text}, headers=who)
                )
            )
            thread.start()
            return thread

        held = score("held", ann, "a b c d e f g h i j")  # 13 model tokens of ann's 16 (32 / 2)
        wait_until(lambda: lane.charged == 13, "ann's score admitted")
        over = c.post("/break-it/api/score", json={"utterance": "k l m n"}, headers=ann)  # 13 + 7 > 16
        other = score("other", ben, "o p q r")  # the same address, another player: admitted
        wait_until(lambda: lane.charged == 20, "ben's score admitted")
        charged_to = sorted(lane.clients)
        fake.gate.set()
        held.join(GUARD_S)
        other.join(GUARD_S)
    assert over.status_code == 429 and "fair share" in over.json()["error"]["message"]
    assert result["held"].status_code == 200 and result["other"].status_code == 200
    assert len(charged_to) == 2 and all(name.startswith("player:") for name in charged_to)
