"""The ecosystem's formats against a real uvicorn server: chat ``messages`` in ``/v1/classify``,
``POST /v1/moderations`` driven by the real ``openai`` client, the operator policy (start, answers,
``/v1/model``, ``POST /admin/policy`` reload under load) and :class:`dialogue_safety.Client`.

The fake classifier (tests/service_conftest.py) scores an utterance 0.9 with a bad word, else 0.1,
plus 0.05 per bad word in the history; its heads are ``offensive`` (the score head) and
``hateful`` (half the score)."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from service_conftest import GUARD_S, FakeClassifier, LiveServer, live_server, tiny_model_dir  # noqa: F401  (fixture)

import dialogue_safety
from dialogue_safety import Client, Label
from dialogue_safety.client import ClientError
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import PolicyError
from dialogue_safety.service.app import create_app
from dialogue_safety.service.moderations import OPENAI_NAMES
from dialogue_safety.service.settings import ServiceSettings

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key-123"
POLICY = """\
[[block]]
name = "no-fruit"
terms = ["banana"]

[[allow]]
name = "our-product"
phrases = ["stupid fast builds"]
"""


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.toml"
    path.write_text(POLICY, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier()) as live:
        yield live


@pytest.fixture(scope="module")
def policed(policy_file: Path) -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier(), policy=policy_file) as live:
        yield live


def post(live: LiveServer, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    with live.client(**kwargs) as c:
        return c.post(path, json=body)


# -- chat messages --------------------------------------------------------------------------------------
CHAT = [
    {"role": "system", "content": "never say idiot"},
    {"role": "user", "content": "you idiot"},
    {"role": "assistant", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]},
]


def test_messages_are_judged_on_the_last_one_with_the_others_as_history(server: LiveServer) -> None:
    r = post(server, "/v1/classify", {"messages": CHAT})
    assert r.status_code == 200, r.text
    same = post(
        server, "/v1/classify", {"history": [{"speaker": "user", "text": "you idiot"}], "utterance": "hello\nthere"}
    )
    assert r.json()["score"] == pytest.approx(same.json()["score"]) == pytest.approx(0.15)
    assert r.json()["judged"] == {"index": 2, "role": "assistant"}
    assert "judged" not in same.json()
    with_system = post(server, "/v1/classify", {"messages": CHAT, "include_system": True}).json()
    assert with_system["score"] == pytest.approx(0.20)  # the system message's bad word is history now
    batch = post(server, "/v1/classify/batch", {"items": [{"messages": CHAT[1:2]}, "fine", {"messages": []}]})
    assert batch.status_code == 200, batch.text
    first, second, third = batch.json()["results"]
    assert (first["label"], first["judged"]) == ("OFFENSIVE", {"index": 0, "role": "user"})
    assert "judged" not in second
    assert third["error"]["field"] == "items[2].messages" and batch.json()["errors"] == 1


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "unsupported_content",
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "utterance": "hi"}, "invalid_request", "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "invalid_message", "messages[0].role"),
        ({"history": ["hi"]}, "invalid_request", "utterance"),
        ({"utterance": None, "messages": [{"role": "user", "content": "hi"}]}, "invalid_request", "utterance"),
        (
            {"messages": [{"role": "user", "content": " "}, {"role": "user", "content": "hi"}]},
            "invalid_message",
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y" * 4001}]},
            "utterance_too_long",
            "messages[1].content",
        ),
        (
            {
                "messages": [
                    {"role": "system", "content": "x"},
                    {"role": "user", "content": "y" * 4001},
                    {"role": "user", "content": "z"},
                ]
            },
            "turn_too_long",
            "messages[1].content",
        ),
        (
            {"messages": [{"role": "system", "content": "x"}] * 33 + [{"role": "user", "content": "z"}]},
            "too_many_history_turns",
            "messages",
        ),
    ],
)
def test_messages_that_cannot_be_judged_get_a_422_naming_them(
    server: LiveServer, body: Any, code: str, field: str
) -> None:
    r = post(server, "/v1/classify", body)
    assert r.status_code == 422, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == (code, field)


# -- /v1/moderations with the real OpenAI client -----------------------------------------------------------
def openai_client(live: LiveServer, api_key: str = "anything", **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key=api_key, max_retries=0, timeout=GUARD_S, **kwargs)


def test_the_openai_client_moderates_a_string_and_a_list(server: LiveServer) -> None:
    client = openai_client(server)
    one = client.moderations.create(input="you are an idiot")
    assert one.id.startswith("modr-") and one.model == "fake@1.2.3"
    [result] = one.results
    assert result.flagged is True
    assert result.categories.harassment is True  # our "offensive" head under OpenAI's name
    assert result.category_scores.harassment == pytest.approx(0.9)
    assert result.category_scores.hate == pytest.approx(0.45)  # "hateful" → hate; below the threshold
    assert result.categories.hate is False
    assert result.category_applied_input_types.harassment == ["text"]
    many = client.moderations.create(input=["have a nice day", "stupid", "fine"], model="omni-moderation-latest")
    assert [r.flagged for r in many.results] == [False, True, False]
    parts = client.moderations.create(input=[{"type": "text", "text": "hello"}, {"type": "text", "text": "idiot"}])
    assert [r.flagged for r in parts.results] == [True]  # parts are one input
    # the extension: a conversation before the input (what unsafe_in_context needs)
    raw = post(server, "/v1/moderations", {"input": "so what", "conversation": [{"role": "user", "content": "idiot"}]})
    assert raw.json()["results"][0]["category_scores"]["harassment"] == pytest.approx(0.15)


def test_moderation_errors_come_in_openai_shape_and_the_client_raises_them(server: LiveServer) -> None:
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.moderations.create(input=[])
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "message": "input is empty; send a text or a list of texts",
        "type": "invalid_request_error",
        "param": "input",
        "code": "invalid_request",
    }
    with pytest.raises(openai.BadRequestError) as caught:
        client.moderations.create(
            input=[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]
        )
    assert caught.value.body["param"] == "input[1]" and caught.value.body["code"] == "unsupported_content"
    r = post(server, "/v1/moderations", {"input": ["fine", " "]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]"
    assert r.json()["error"]["code"] == "empty_utterance"
    r = post(server, "/v1/moderations", {"input": "hi", "bogus": 1})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.json()["error"]["code"] == "unknown_field"
    assert post(server, "/v1/classify", {"bogus": 1}).json()["error"].keys() == {"code", "message", "field"}


def test_the_openai_client_gets_an_authentication_error_for_a_wrong_key() -> None:
    with live_server(classifier=FakeClassifier(), api_key=KEY) as live:
        assert openai_client(live, api_key=KEY).moderations.create(input="hi").results[0].flagged is False
        with pytest.raises(openai.AuthenticationError) as caught:
            openai_client(live, api_key="wrong").moderations.create(input="hi")
    assert caught.value.body["code"] == "unauthorized" and caught.value.body["type"] == "invalid_request_error"


def test_the_openai_client_on_a_real_onnx_model(tiny_model_dir: Path) -> None:
    heads = ModelCard.load(tiny_model_dir).heads
    with live_server(model_dir=tiny_model_dir, variant="fp32") as live:
        answer = openai_client(live).moderations.create(input=["you are an idiot", "have a nice day"])
        classified = post(live, "/v1/classify/batch", {"items": ["you are an idiot", "have a nice day"]}).json()
    assert answer.model == classified["model"]
    for result, same in zip(answer.results, classified["results"], strict=True):
        assert set(result.category_scores.model_dump(exclude_unset=True)) == {OPENAI_NAMES.get(h, h) for h in heads}
        assert result.flagged is any(result.categories.model_dump(exclude_unset=True).values())  # OpenAI's invariant
        scores = {OPENAI_NAMES.get(h, h): p for h, p in same["categories"].items()}
        assert result.category_scores.model_dump(exclude_unset=True) == pytest.approx(scores)


def test_model_heads_come_from_the_card_and_unknown_heads_keep_their_names() -> None:
    with live_server(classifier=FakeClassifier(heads=("offensive", "unsafe_in_context", "violence"))) as live:
        result = post(live, "/v1/moderations", {"input": "idiot"}).json()["results"][0]
    assert set(result["category_scores"]) == {"harassment", "unsafe_in_context", "violence"}


# -- the operator policy --------------------------------------------------------------------------------
def test_a_block_term_makes_a_harmless_text_offensive_and_names_the_rule(
    policed: LiveServer, server: LiveServer
) -> None:
    body = {"utterance": "I like banana bread"}
    blocked = post(policed, "/v1/classify", body).json()
    assert (blocked["label"], blocked["policy"], blocked["score"]) == ("OFFENSIVE", "no-fruit", pytest.approx(0.1))
    plain = post(server, "/v1/classify", body).json()
    assert plain["label"] == "SAFE" and "policy" not in plain  # the same request without the policy
    allowed = post(policed, "/v1/classify", {"utterance": "Stupid   fast builds"}).json()
    assert (allowed["label"], allowed["policy"]) == ("SAFE", "our-product")
    batch = post(
        policed,
        "/v1/classify/batch",
        {"items": ["banana", "idiot", {"messages": [{"role": "user", "content": "BANANA!"}]}]},
    )
    assert [r.get("policy") for r in batch.json()["results"]] == ["no-fruit", None, "no-fruit"]
    moderated = openai_client(policed).moderations.create(input=["a banana", "hello"])
    assert [r.flagged for r in moderated.results] == [True, False]
    assert moderated.results[0].model_extra["policy"] == "no-fruit"
    with policed.client() as c:
        shown = c.get("/v1/model").json()["serving"]["policy"]
    assert shown["block"] == [{"name": "no-fruit", "terms": 1, "regexes": 0}]
    assert shown["source"].endswith("policy.toml")


def test_the_policy_is_reloaded_without_dropping_a_request(tmp_path: Path) -> None:
    first = tmp_path / "first.toml"
    first.write_text('[[block]]\nname = "first"\nterms = ["banana"]\n', encoding="utf-8")
    second = tmp_path / "second.toml"
    second.write_text('[[block]]\nname = "second"\nterms = ["banana"]\n', encoding="utf-8")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[block]]\nname = "x"\nregexes = ["("]\n', encoding="utf-8")
    fake = FakeClassifier()
    with live_server(classifier=fake, api_key=KEY, policy=first, policy_dir=tmp_path) as live:
        auth = {"headers": {"Authorization": f"Bearer {KEY}"}}

        async def scenario() -> tuple[httpx.Response, httpx.Response]:
            async with httpx.AsyncClient(base_url=live.url, timeout=GUARD_S, **auth) as c:
                fake.entered.clear()
                fake.gate.clear()  # a request held in inference while the policy is swapped
                held = asyncio.create_task(c.post("/v1/classify", json={"utterance": "banana"}))
                await asyncio.to_thread(fake.entered.wait, GUARD_S)
                reload = await c.post("/admin/policy", json={"path": str(second)})
                fake.gate.set()
                return await held, reload

        held, reload = asyncio.run(scenario())
        assert reload.status_code == 200, reload.text
        assert reload.json()["previous"] == first.name and reload.json()["policy"]["block"][0]["name"] == "second"
        assert held.status_code == 200 and held.json()["policy"] == "second"  # decided under the policy it met
        refused = post(live, "/admin/policy", {"path": str(bad)}, **auth)
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "policy_refused"
        message = refused.json()["error"]["message"]  # the file's name, never the server's path
        assert "bad.toml:3: block[0].regexes[0] is not a valid regex" in message and str(tmp_path) not in message
        assert post(live, "/v1/classify", {"utterance": "banana"}, **auth).json()["policy"] == "second"  # kept
        assert post(live, "/admin/policy", None).status_code == 401  # the API key, as the other admin routes
        again = post(live, "/admin/policy", None, **auth)  # no body: the file in force, read again
        assert again.status_code == 200 and again.json()["policy"]["source"] == second.name


def test_a_moderation_decided_while_the_policy_is_reloaded_answers_under_one_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A moderation's rules are matched (in a worker thread) under the policy it met; a reload meanwhile must not
    shape its categories: the old block rule decided it, so it is flagged, and a category says so."""
    from dialogue_safety.core.policy import Policy

    old = tmp_path / "old.toml"
    old.write_text('[categories]\nhateful = 0.3\n[[block]]\nname = "shared"\nterms = ["banana"]\n', encoding="utf-8")
    new = tmp_path / "new.toml"
    new.write_text('[categories]\nhateful = 0.9\n[[allow]]\nname = "shared"\nphrases = ["else"]\n', encoding="utf-8")
    matching, reloaded = threading.Event(), threading.Event()
    match = Policy.match

    def held(self: Policy, utterance: Any, card: Any) -> Any:
        if Path(str(self.source)).name == old.name and not reloaded.is_set():
            matching.set()
            assert reloaded.wait(GUARD_S)
        return match(self, utterance, card)

    monkeypatch.setattr(Policy, "match", held)
    with live_server(classifier=FakeClassifier(), api_key=KEY, policy=old, policy_dir=tmp_path) as live:
        auth = {"headers": {"Authorization": f"Bearer {KEY}"}}
        answer: dict[str, Any] = {}

        def moderate() -> None:
            answer.update(post(live, "/v1/moderations", {"input": "banana"}, **auth).json())

        thread = threading.Thread(target=moderate)
        thread.start()
        assert matching.wait(GUARD_S)
        assert post(live, "/admin/policy", {"path": str(new)}, **auth).status_code == 200
        reloaded.set()
        thread.join(GUARD_S)
    [result] = answer["results"]
    assert result["flagged"] is True and any(result["categories"].values()), result


def test_a_bad_policy_file_stops_the_start_with_file_line_and_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[categories]\noffensive = 0.5\nhateful = 7\n", encoding="utf-8")
    with pytest.raises(PolicyError, match=r"bad.toml:3: categories.hateful must be a threshold"):
        create_app(ServiceSettings(policy=bad), classifier_factory=lambda _s: FakeClassifier())
    missing_head = tmp_path / "heads.toml"
    missing_head.write_text("[categories]\n\nself_harm = 0.2\n", encoding="utf-8")  # a head no model has
    for path, words in ((bad, "bad.toml:3: categories.hateful"), (missing_head, "heads.toml:3: categories.self_harm")):
        run = subprocess.run(
            [sys.executable, "-m", "dialogue_safety.cli.main", "serve", "--policy", str(path), "--port", "0"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 2, run.stderr
        assert "invalid policy" in run.stderr and words in run.stderr


def test_category_settings_decide_flagged_and_the_categories_of_moderations(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[categories]\noffensive = "off"\nhateful = 0.4\n', encoding="utf-8")
    with live_server(classifier=FakeClassifier(), policy=policy) as live:
        [result] = post(live, "/v1/moderations", {"input": "idiot"}).json()["results"]
        assert result["category_scores"] == {"harassment": pytest.approx(0.9), "hate": pytest.approx(0.45)}
        assert result["categories"] == {"harassment": False, "hate": True}  # off; 0.45 >= the policy's 0.4
        assert result["flagged"] is True and "policy" not in result  # hate decides now: the label did not change
        policy.write_text('[categories]\noffensive = "off"\nhateful = 0.5\n', encoding="utf-8")
        live.app.state.safety.policy = dialogue_safety.load_policy(policy)
        [result] = post(live, "/v1/moderations", {"input": "idiot"}).json()["results"]
        assert (result["flagged"], result["policy"]) == (False, "categories.offensive")
        assert result["categories"] == {"harassment": False, "hate": False}
        classified = post(live, "/v1/classify", {"utterance": "idiot"}).json()
        assert (classified["label"], classified["policy"]) == ("SAFE", "categories.offensive")


def test_a_model_without_a_head_the_policy_names_is_refused_loudly(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[categories]\nhateful = 0.3\n", encoding="utf-8")
    with live_server(classifier=FakeClassifier(heads=("offensive",)), policy=policy, wait_ready=False) as live:
        deadline = time.monotonic() + GUARD_S
        with live.client() as c:
            while (health := c.get("/health")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.02)
    assert health.status_code == 503 and health.json()["error"]["code"] == "model_failed"
    assert f"{policy}:2: categories.hateful: the model has no 'hateful' head" in live.app.state.safety.load_error


# -- the Python client ----------------------------------------------------------------------------------
def test_the_client_mirrors_classify_and_classify_batch(policed: LiveServer) -> None:
    client = Client(policed.url, api_key="unused")
    one = client.classify("you idiot")
    assert (one.label, one.score, one.categories["hateful"]) == (
        Label.OFFENSIVE,
        pytest.approx(0.9),
        pytest.approx(0.45),
    )
    assert client.classify("hello", ["idiot"]).score == pytest.approx(0.15)
    assert client.classify(messages=CHAT).score == pytest.approx(0.15)
    assert client.classify("banana").policy == "no-fruit"
    batch = client.classify_batch(["idiot", dialogue_safety.Example.from_texts("ok", ["stupid"])], threshold=0.12)
    assert [(p.label, p.threshold) for p in batch] == [(Label.OFFENSIVE, 0.12), (Label.OFFENSIVE, 0.12)]
    with pytest.raises(ClientError) as caught:
        client.classify_batch(["fine", "   "])
    assert (caught.value.status, caught.value.code, caught.value.field) == (
        422,
        "empty_utterance",
        "items[1].utterance",
    )
    with pytest.raises(ClientError) as unreachable:
        Client("http://127.0.0.1:9", retries=0).classify("hi")
    assert unreachable.value.status == 0


def _count_429(live: LiveServer) -> float:
    with live.client() as c:
        lines = c.get("/metrics").text.splitlines()
    return sum(
        float(line.split()[-1]) for line in lines if line.startswith("safety_requests_total") and 'status="429"' in line
    )


def test_the_client_retries_a_429_after_retry_after() -> None:
    fake = FakeClassifier()
    fake.gate.clear()
    # a budget of 16 tokens: one request in inference (7 tokens) holds most of this client's fair share (8)
    with live_server(classifier=fake, max_pending_tokens=16) as live:
        with httpx.Client(base_url=live.url, timeout=GUARD_S) as c:
            held = {"json": {"utterance": "x y z w"}}
            busy = [threading.Thread(target=c.post, args=("/v1/classify",), kwargs=held)]
            busy[0].start()
            assert fake.entered.wait(GUARD_S)
            deadline = time.monotonic() + GUARD_S
            with pytest.raises(ClientError) as caught:
                Client(live.url, retries=0).classify("b")  # no retries: the 429 itself
            assert caught.value.status == 429 and caught.value.code == "overloaded"
            refused = _count_429(live)

            def open_after_a_refusal() -> None:  # the gate opens once the client's first try was refused
                while _count_429(live) <= refused and time.monotonic() < deadline:
                    time.sleep(0.01)
                fake.gate.set()

            opener = threading.Thread(target=open_after_a_refusal)
            opener.start()
            prediction = Client(live.url, retries=3).classify("idiot")
            opener.join(GUARD_S)
            for t in busy:
                t.join(10)
        assert prediction.label is Label.OFFENSIVE
        assert _count_429(live) > refused  # it was refused first, then retried


def test_every_refusal_on_moderations_comes_in_openai_shape_whoever_refuses() -> None:
    """The body guard (413), the strict JSON reader (400), routing (405) and the route answer there in OpenAI's
    shape, with a Content-Length that fits the rewritten body; other paths keep the service's shape."""
    openai_keys = {"message", "type", "param", "code"}
    with live_server(classifier=FakeClassifier(), max_body_bytes=4096) as live, live.client() as c:
        json_type = {"content-type": "application/json"}
        too_large = c.post("/v1/moderations", content=b'{"input": "' + b"a" * 5000 + b'"}', headers=json_type)
        duplicate = c.post("/v1/moderations", content=b'{"input": "a", "input": "b"}', headers=json_type)
        wrong_method = c.get("/v1/moderations")
        elsewhere = c.post("/v1/classify", content=b'{"utterance": "a", "utterance": "b"}', headers=json_type)
    assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "payload_too_large"
    assert duplicate.status_code == 400 and duplicate.json()["error"]["code"] == "duplicate_key"
    assert wrong_method.status_code == 405
    for answer in (too_large, duplicate, wrong_method):
        assert set(answer.json()["error"]) == openai_keys, answer.text
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert int(answer.headers["content-length"]) == len(answer.content)
    assert set(elsewhere.json()["error"]) == {"code", "message", "field"}
