"""Per-item results in /v1/classify/batch and ``"explain": true`` on /v1/classify, against a real
uvicorn server (fake classifier: a word is bad or not, so contributions are known exactly)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from service_conftest import FakeClassifier, LiveServer, live_server

LIMITS: dict[str, Any] = dict(max_request_history_turns=2, max_turn_chars=20, max_utterance_chars=30, max_batch_items=8)


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier(), **LIMITS) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_a_bad_item_gets_an_error_in_its_slot_and_the_others_are_classified(
    server: LiveServer, client: httpx.Client
) -> None:
    items: list[Any] = [
        "you idiot",
        "",
        {"history": ["w" * 21], "utterance": "fine"},
        {"utterance": "z" * 31},
        {"history": ["a", "b", "c"], "utterance": "x"},
        {"history": ["hate"], "utterance": "nice soup"},
    ]
    predicted_before = sum(len(b) for b in server.classifier.batches)  # type: ignore[union-attr]
    r = client.post("/v1/classify/batch", json={"items": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["errors"] == 4 and len(body["results"]) == len(items)
    ok, empty, turn, long, turns, ctx = body["results"]
    assert ok["label"] == "OFFENSIVE" and ok["score"] == pytest.approx(0.9)
    assert ctx["label"] == "SAFE" and ctx["score"] == pytest.approx(0.15)
    assert empty == {
        "error": {"code": "empty_utterance", "message": empty["error"]["message"], "field": "items[1].utterance"}
    }
    assert turn["error"]["code"] == "turn_too_long" and turn["error"]["field"] == "items[2].history[0]"
    assert long["error"]["code"] == "utterance_too_long" and long["error"]["field"] == "items[3].utterance"
    assert turns["error"]["code"] == "too_many_history_turns" and turns["error"]["field"] == "items[4].history"
    for slot in (empty, turn, long, turns):
        assert set(slot) == {"error"}  # no label or score a client could mistake for a result
        assert slot["error"]["message"]
    assert "z" * 31 not in r.text and "w" * 21 not in r.text  # texts never echoed
    # only the two valid items reached the model
    assert sum(len(b) for b in server.classifier.batches) - predicted_before == 2  # type: ignore[union-attr]
    # the classified slots equal the same items sent alone
    alone = client.post("/v1/classify/batch", json={"items": [items[0], items[5]]}).json()
    assert alone["errors"] == 0 and alone["results"] == [ok, ctx]


def test_all_items_bad_is_still_a_per_item_answer(client: httpx.Client) -> None:
    body = client.post("/v1/classify/batch", json={"items": ["", " "]}).json()
    assert body["errors"] == 2 and [s["error"]["code"] for s in body["results"]] == ["empty_utterance"] * 2


def test_item_errors_fail_keeps_the_all_or_nothing_behaviour(client: httpx.Client) -> None:
    r = client.post("/v1/classify/batch", json={"items": ["fine", ""], "item_errors": "fail"})
    assert r.status_code == 422
    assert r.json()["error"] == {
        "code": "empty_utterance",
        "message": r.json()["error"]["message"],
        "field": "items[1].utterance",
    }
    bad_mode = client.post("/v1/classify/batch", json={"items": ["fine"], "item_errors": "skip"})
    assert bad_mode.status_code == 422 and bad_mode.json()["error"]["field"] == "item_errors"


def test_an_item_of_the_wrong_type_gets_an_error_in_its_slot_like_an_empty_one(client: httpx.Client) -> None:
    items: list[Any] = ["you idiot", 42, None, ["a"], {"utterence": "hi"}, {"utterance": 5}, ""]
    r = client.post("/v1/classify/batch", json={"items": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["errors"] == 6 and body["results"][0]["label"] == "OFFENSIVE"
    number, null, array, typo, not_text, empty = (slot["error"] for slot in body["results"][1:])
    assert number == {
        "code": "invalid_item",
        "message": "items[1] must be a string or an object with an utterance; got a number",
        "field": "items[1]",
    }
    assert null["field"] == "items[2]" and null["message"].endswith("got null")
    assert array["field"] == "items[3]" and array["message"].endswith("got an array")
    assert typo == {
        "code": "unknown_field",
        "message": "unknown field 'items[4].utterence'; did you mean 'utterance'?",
        "field": "items[4].utterence",
    }
    assert not_text["field"] == "items[5].utterance" and not_text["code"] == "invalid_request"
    assert empty["code"] == "empty_utterance"  # the same slot shape as an item that breaks a limit
    # item_errors=fail: the first such item refuses the whole request, as for an empty one
    failed = client.post("/v1/classify/batch", json={"items": ["fine", 42], "item_errors": "fail"})
    assert failed.status_code == 422 and failed.json()["error"]["field"] == "items[1]"


def test_an_unknown_field_is_named_first_with_the_closest_known_one(client: httpx.Client) -> None:
    r = client.post("/v1/classify", json={"utterence": "hello"})
    assert r.status_code == 422
    assert r.json()["error"] == {
        "code": "unknown_field",
        "message": "unknown field 'utterence'; did you mean 'utterance'?",
        "field": "utterence",
    }
    nested = client.post("/v1/classify", json={"utterance": "hi", "history": [{"txt": "a", "text": "b"}]})
    assert nested.json()["error"]["message"] == "unknown field 'history[0].txt'; did you mean 'text'?"
    far = client.post("/v1/classify", json={"utterance": "hi", "zzz": 1}).json()["error"]
    assert far["message"] == "unknown field 'zzz'" and far["code"] == "unknown_field"
    batch = client.post("/v1/classify/batch", json={"itmes": ["a"]}).json()["error"]
    assert batch["message"] == "unknown field 'itmes'; did you mean 'items'?"
    # a field of another request ('text' of a history turn) is not suggested back to itself
    other = client.post("/v1/classify", json={"text": "hi", "history": ["Should I?"]}).json()["error"]
    assert other["message"] == "unknown field 'text'" and other["field"] == "text", other


def test_whole_request_problems_stay_4xx(client: httpx.Client) -> None:
    assert client.post("/v1/classify/batch", json={"items": ["a"] * 9}).json()["error"]["code"] == "too_many_items"
    assert client.post("/v1/classify/batch", json={"items": []}).status_code == 422
    malformed = client.post("/v1/classify/batch", content=b'{"items": [', headers={"content-type": "application/json"})
    assert malformed.status_code == 400


def test_explain_gives_each_word_its_contribution(client: httpx.Client) -> None:
    text = "you  are an IDIOT!"
    plain = client.post("/v1/classify", json={"utterance": text}).json()
    r = client.post("/v1/classify", json={"utterance": text, "explain": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["score"] == plain["score"] and body["label"] == plain["label"]
    ex = body["explanation"]
    assert ex["method"] == "shapley" and ex["score"] == body["score"] and ex["unexplained_words"] == 0
    assert ex["exact"] and ex["baseline"] == pytest.approx(0.1) and "history" not in ex
    words = ex["utterance"]
    assert [w["word"] for w in words] == ["you", "are", "an", "IDIOT!"]
    assert all(text[w["start"] : w["end"]] == w["word"] for w in words)
    # the fake model: the bad word alone makes the score 0.9 instead of 0.1
    assert [w["contribution"] for w in words] == pytest.approx([0.0, 0.0, 0.0, 0.8])


def test_shapley_sees_redundant_words_and_occlusion_stays_an_option(client: httpx.Client) -> None:
    """The fake model's score is 0.9 with any bad word: two bad words are redundant evidence."""
    text = "stupid idiot here"
    shapley = client.post("/v1/classify", json={"utterance": text, "explain": True}).json()["explanation"]
    assert [w["contribution"] for w in shapley["utterance"]] == pytest.approx([0.4, 0.4, 0.0])
    body = {"utterance": text, "explain": True, "explain_method": "occlusion"}
    occlusion = client.post("/v1/classify", json=body).json()["explanation"]
    assert occlusion["method"] == "occlusion" and "baseline" not in occlusion
    assert [w["contribution"] for w in occlusion["utterance"]] == pytest.approx([0.0, 0.0, 0.0])  # blind to it
    r = client.post("/v1/classify", json={"utterance": text, "explain": True, "explain_method": "lime"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "explain_method"


def test_explain_history_words(client: httpx.Client) -> None:
    body = client.post(
        "/v1/classify",
        json={
            "history": ["I hate you", {"speaker": "bot", "text": "why"}],
            "utterance": "ok",
            "explain": True,
            "explain_history": True,
        },
    ).json()
    ex = body["explanation"]
    assert [w["word"] for w in ex["utterance"]] == ["ok"]
    assert [[w["word"] for w in turn] for turn in ex["history"]] == [["I", "hate", "you"], ["why"]]
    assert ex["history"][0][1]["contribution"] == pytest.approx(0.05)  # a bad history word adds 0.05
    assert ex["history"][0][0]["contribution"] == pytest.approx(0.0)
    without = client.post("/v1/classify", json={"history": ["I hate you", "why"], "utterance": "ok"}).json()
    assert body["score"] == without["score"]


def test_explain_is_off_by_default_and_validated(client: httpx.Client) -> None:
    assert "explanation" not in client.post("/v1/classify", json={"utterance": "hi"}).json()
    for loose in ("please", 0, 1, "true"):  # strict booleans, as the schema says (found by the fuzzer)
        r = client.post("/v1/classify", json={"utterance": "hi", "explain": loose})
        assert r.status_code == 422 and r.json()["error"]["field"] == "explain", loose
    r = client.post("/v1/classify", json={"utterance": "hi", "explain": True, "explain_history": 1})
    assert r.status_code == 422 and r.json()["error"]["field"] == "explain_history"
    r = client.post("/v1/classify/batch", json={"items": [{"utterance": "hi", "explain": True}]})
    # explanations are per request, not per batch item: that item is refused in its slot
    assert r.status_code == 200 and r.json()["results"][0]["error"]["field"] == "items[0].explain"


def test_long_utterances_are_explained_up_to_the_cap() -> None:
    # the text costs 11 model tokens ([CLS] [SEP] 8 words [SEP]); an explanation may cost half the explain lane (66)
    with live_server(classifier=FakeClassifier(), max_explain_tokens=132) as live, live.client() as c:
        body = c.post("/v1/classify", json={"utterance": "a b c d e f g idiot", "explain": True}).json()
    words = body["explanation"]["utterance"]
    # 66 // 11 = 6 sequences: an exact game of 2 words (the request, no words, 2 coalitions) fits, one of 3 (8) not
    assert len(words) == 8 and body["explanation"]["unexplained_words"] == 6
    assert [w["contribution"] is None for w in words] == [False] * 2 + [True] * 6


def test_the_schema_leaves_batch_items_open_as_the_api_reports_them_in_their_slot(client: httpx.Client) -> None:
    """The contract fuzzer's negative mode sends what the schema forbids and expects a 4xx: a batch item the
    schema forbade (a string without a visible character, a number) got 200 with its slot's error."""
    items = client.get("/openapi.json").json()["components"]["schemas"]["BatchRequest"]["properties"]["items"]
    assert items["minItems"] == 1 and items["maxItems"] == LIMITS["max_batch_items"]
    shapes = items["items"]["anyOf"]
    assert {"$ref": "#/components/schemas/DialogueItem"} in shapes and {"type": "string"} in shapes
    assert any(set(shape) <= {"description"} for shape in shapes)  # anything else: accepted, reported in its slot
    r = client.post("/v1/classify/batch", json={"items": ["\u200b", 7, "x" * 31]})
    assert r.status_code == 200 and r.json()["errors"] == 3
