"""Answers that agree with themselves, OpenAI transcripts as they are, every turn of a conversation.

* ``/v1/moderations`` driven by the real ``openai`` client: ``flagged`` is true exactly when a category
  is, each category at its own threshold from the card; a head too weak to decide is a score only.
* OpenAI tool-call transcripts (``developer``, ``tool_calls`` with null content, ``tool`` messages) are
  judged; errors name the field as the client wrote it.
* ``POST /v1/classify/conversation``, :func:`dialogue_safety.classify_conversation`, ``Client`` and
  ``score --every-turn``: a verdict for every turn, each given the turns before it.

The fake classifier (tests/service_conftest.py) scores an utterance 0.9 with a bad word, else 0.1, plus
0.05 per bad word in the history; every head after the first scores half of that.
"""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from service_conftest import FakeClassifier, LiveServer, live_server, tiny_model_dir  # noqa: F401  (fixture)

import dialogue_safety
from dialogue_safety import Client
from dialogue_safety.cli.main import main as cli_main
from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.messages import every_turn, parse_messages
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import default_model_dir
from dialogue_safety.core.schema import Turn
from dialogue_safety.export.categories import MIN_DECIDING_F1, tune_categories
from dialogue_safety.service.moderations import OPENAI_NAMES

HEADS = ("offensive", "hateful", "violence")
#: the card's per-category rules of the fake model: violence is too weak to decide (a score only)
CATEGORIES = {
    "offensive": {"threshold": 0.95, "score_only": False},
    "hateful": {"threshold": 0.3, "score_only": False},
    "violence": {"threshold": 0.05, "score_only": True},
}
TOOL_TRANSCRIPT: list[dict[str, Any]] = [
    {"role": "developer", "content": "You are a weather bot. Never insult anyone."},
    {"role": "user", "content": "what's the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "stupid rain, 12 C"},
    {"role": "assistant", "content": "Rain and 12 C, you idiot."},
]


def fake_with_categories() -> FakeClassifier:
    fake = FakeClassifier(heads=HEADS)
    fake.card.categories = {h: dict(c) for h, c in CATEGORIES.items()}
    return fake


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(classifier=fake_with_categories()) as live:
        yield live


def post(live: LiveServer, path: str, body: Any) -> httpx.Response:
    with live.client() as c:
        return c.post(path, json=body)


def openai_client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="anything", max_retries=0, timeout=10)


def assert_agrees_with_itself(result: Any) -> None:
    categories = result.categories.model_dump(exclude_unset=True)
    assert result.flagged is any(categories.values()), categories


# -- /v1/moderations: flagged exactly when a category is ---------------------------------------------------
def test_flagged_is_true_exactly_when_a_category_is_each_at_its_card_threshold(server: LiveServer) -> None:
    texts = ["you idiot", "have a nice day", "stupid", "fine thanks"]
    answer = openai_client(server).moderations.create(input=texts)
    for result in answer.results:
        assert_agrees_with_itself(result)
    idiot, nice = answer.results[0], answer.results[1]
    # offensive 0.9 is below its own 0.95: harassment false, though /v1/classify's label (0.9 >= 0.5) is OFFENSIVE
    assert idiot.categories.harassment is False and idiot.category_scores.harassment == pytest.approx(0.9)
    assert idiot.categories.hate is True and idiot.flagged is True  # hateful 0.45 >= its own 0.3
    assert nice.flagged is False and nice.categories.hate is False  # 0.05 < 0.3
    with server.client() as c:
        shown = c.get("/v1/model").json()["category_thresholds"]
    assert shown == {"offensive": 0.95, "hateful": 0.3, "violence": None}


def test_a_head_too_weak_to_decide_is_a_score_only_never_an_openai_category(server: LiveServer) -> None:
    [result] = openai_client(server).moderations.create(input="you idiot").results
    assert "violence" not in result.categories.model_dump(exclude_unset=True)
    assert result.category_scores.violence is None  # OpenAI's "violence" is not claimed by a head that cannot decide
    assert result.model_extra["scores_only"] == {"violence": pytest.approx(0.45)}


def test_a_card_without_category_thresholds_judges_every_head_at_its_threshold() -> None:
    card = ModelCard(heads=["offensive", "violence"], threshold=0.4)
    assert card.category_threshold("violence") == 0.4
    card.categories = {"offensive": {"threshold": 0.3, "score_only": False}}
    assert (card.category_threshold("offensive"), card.category_threshold("violence")) == (0.3, None)


def test_the_openai_client_on_a_real_onnx_model_never_contradicts_itself(tiny_model_dir: Path) -> None:
    heads = ModelCard.load(tiny_model_dir).heads
    texts = ["you are an idiot", "have a nice day", "I will hurt you", "How do I kill a Python process?"]
    with live_server(model_dir=tiny_model_dir, variant="fp32") as live:
        answer = openai_client(live).moderations.create(input=texts)
    for result in answer.results:
        assert_agrees_with_itself(result)
        named = set(result.category_scores.model_dump(exclude_unset=True)) | set(
            result.model_extra.get("scores_only", {})
        )
        assert named == {OPENAI_NAMES.get(h, h) for h in heads} | {h for h in result.model_extra.get("scores_only", {})}


def test_the_shipped_card_states_each_category_by_the_documented_rule() -> None:
    card = ModelCard.load(default_model_dir())
    assert set(card.categories) == set(card.heads)
    for head, entry in card.categories.items():
        assert entry["score_only"] is (entry["valid_macro_f1"] < MIN_DECIDING_F1), head
        assert 0 < entry["threshold"] < 1 and entry["valid"], head
        assert all(not name.endswith("/test") for name in entry["valid"])  # validation splits only
    assert card.category_threshold("violence") is None  # the weak head of 0.5.0 (validation F1 far below the bar)


def test_tuning_picks_each_heads_threshold_on_its_own_rows_and_marks_a_weak_one() -> None:
    from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split

    def row(text: str, positive: bool, family: LabelFamily = LabelFamily.OFFENSIVE, **meta: Any) -> LabelledExample:
        label = Label.OFFENSIVE if positive else Label.SAFE
        return LabelledExample(utterance=text, label=label, source="s", split=Split.VALID, family=family, metadata=meta)

    kinds = [row("a", True, violence=True), row("b", True, violence=False), row("c", False, violence=False)]
    rows = [*kinds, row("d", False, violence=False)] * 4
    # offensive separates its labels; violence scores its one positive kind (1 row in 4) lowest: at best it flags
    # everything (F1 40), too weak to decide
    probs = {"s/valid": np.array([[0.9, 0.1], [0.8, 0.9], [0.1, 0.8], [0.1, 0.7]] * 4)}
    out = tune_categories(["offensive", "violence"], probs, {"s/valid": rows})
    assert out["offensive"]["score_only"] is False and 0.1 < out["offensive"]["threshold"] <= 0.8
    assert out["offensive"]["valid"]["s/valid"]["offensive_f1"] == 100.0
    assert out["violence"]["score_only"] is True and out["violence"]["valid_macro_f1"] < MIN_DECIDING_F1


def test_tuning_reads_only_the_sources_the_recipe_trusts_for_a_threshold() -> None:
    from types import SimpleNamespace

    from dialogue_safety.core.schema import Label, LabelledExample, Split
    from dialogue_safety.export.categories import threshold_sources

    card = SimpleNamespace(training={"recipe": {"threshold_tasks": ["olid", "bad_fsb/bot", "bad_fsb/human"]}})
    assert threshold_sources(card) == {"olid", "bad_fsb"}
    assert threshold_sources(SimpleNamespace(training={})) is None  # no recipe recorded: every source

    def rows(source: str) -> list[LabelledExample]:
        return [
            LabelledExample(utterance=t, label=lab, source=source, split=Split.VALID)
            for t, lab in (("a", Label.OFFENSIVE), ("b", Label.SAFE)) * 4
        ]

    # "olid" separates its labels at 0.5; "reddit" (not trusted) scores them backwards and would drag the head
    # below the bar if it counted
    probs = {"olid": np.array([[0.9], [0.1]] * 4), "reddit": np.array([[0.1], [0.9]] * 4)}
    validation = {"olid": rows("olid"), "reddit": rows("reddit")}
    trusted = tune_categories(["offensive"], probs, validation, threshold_sources(card))["offensive"]
    assert set(trusted["valid"]) == {"olid"} and trusted["score_only"] is False
    assert tune_categories(["offensive"], probs, validation)["offensive"]["valid_macro_f1"] < trusted["valid_macro_f1"]


def test_the_bundled_model_flags_the_headline_reply_in_its_context_through_moderations() -> None:
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.schema import Example
    from dialogue_safety.service.moderations import moderation_result

    clf = OnnxClassifier(default_model_dir(), variant="fp32")  # fp32: the same on every CPU family
    headline = Example(utterance="Yes, you should definitely do it!", history=(Turn("Should I hurt myself?"),))
    alone = Example(utterance="Yes, you should definitely do it!")
    answers = [{"categories": dict(p.categories)} for p in clf.predict([headline, alone])]
    in_context, by_itself = (moderation_result(a, clf.card, None) for a in answers)
    assert in_context["flagged"] is True and in_context["categories"]["unsafe_in_context"] is True, in_context
    assert by_itself["flagged"] is False, by_itself


# -- OpenAI transcripts as they are -------------------------------------------------------------------------
def test_a_tool_call_transcript_is_judged_with_developer_read_as_system() -> None:
    judged = parse_messages(TOOL_TRANSCRIPT)
    assert judged.example.utterance == "Rain and 12 C, you idiot."
    assert judged.example.history == (Turn("what's the weather in Paris?", "user"),)  # no tool call, no tool result
    with_system = parse_messages(TOOL_TRANSCRIPT, include_system=True).example.history
    assert with_system[0] == Turn("You are a weather bot. Never insult anyone.", "system")
    with pytest.raises(InvalidInput) as caught:
        parse_messages(TOOL_TRANSCRIPT[:3])  # ends on the tool call: nothing to judge
    assert (caught.value.code, caught.value.field) == ("invalid_message", "messages[2].content")


def test_the_service_judges_a_tool_call_transcript_and_names_fields_as_sent(server: LiveServer) -> None:
    r = post(server, "/v1/classify", {"messages": TOOL_TRANSCRIPT})
    assert r.status_code == 200, r.text
    assert r.json()["judged"] == {"index": 4, "role": "assistant"} and r.json()["label"] == "OFFENSIVE"
    assert r.json()["score"] == pytest.approx(0.9)  # the tool result's "stupid" is not history
    bad = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    r = post(server, "/v1/classify", {"messages": bad})
    assert r.status_code == 422
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_message", "messages[1].content")
    r = post(server, "/v1/classify", {"messages": [{"role": "user", "content": 5}]})
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_message", "messages[0].content")
    r = post(server, "/v1/classify", {"messages": [{"role": "robot", "content": "x"}]})
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == ("invalid_message", "messages[0].role")
    r = post(server, "/v1/classify/batch", {"items": [{"utterance": 5}]})
    assert r.json()["results"][0]["error"]["field"] == "items[0].utterance"
    moderated = post(server, "/v1/moderations", {"input": "ok", "conversation": TOOL_TRANSCRIPT})
    assert moderated.status_code == 200, moderated.text
    for role in (["user"], {"x": 1}):  # not a string: a 4xx naming it, on every door that reads messages
        r = post(server, "/v1/classify", {"messages": [{"role": role, "content": "hi"}]})
        assert (r.status_code, r.json()["error"]["field"]) == (422, "messages[0].role")
        r = post(server, "/v1/classify/batch", {"items": [{"messages": [{"role": role, "content": "x"}]}]})
        assert r.status_code == 200 and r.json()["results"][0]["error"]["field"] == "items[0].messages[0].role"
        r = post(server, "/v1/moderations", {"input": "hi", "conversation": [{"role": role, "content": "x"}]})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "conversation[0].role")


def test_moderations_name_the_conversation_message_at_fault_as_sent(server: LiveServer) -> None:
    """The item limits name the message of `conversation` at fault by its place in the list sent (system, tool
    call and tool messages counted), as /v1/classify names `messages[N].content`."""
    conversation = [
        {"role": "system", "content": "be nice"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function"}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "user", "content": "ok"},
        {"role": "user", "content": "x " * 2100},
    ]
    r = post(server, "/v1/moderations", {"input": "hi", "conversation": conversation})
    assert r.status_code == 400 and r.json()["error"]["code"] == "turn_too_long"
    assert r.json()["error"]["param"] == "conversation[4].content"
    r = post(server, "/v1/moderations", {"input": "x" * 4001, "conversation": conversation[:4]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "input")


# -- every turn of a conversation ---------------------------------------------------------------------------
CHAT = [
    {"role": "system", "content": "be kind"},
    {"role": "user", "content": "Should I quit my job?"},
    {"role": "assistant", "content": "Only an idiot would ask."},
    {"role": "user", "content": "ok thanks"},
]


def test_every_turn_is_judged_given_the_turns_before_it() -> None:
    judged = every_turn(CHAT)
    assert [(j.index, j.role) for j in judged] == [(1, "user"), (2, "assistant"), (3, "user")]
    assert [len(j.example.history) for j in judged] == [0, 1, 2]
    assert [j.index for j in every_turn(CHAT, roles=["assistant"])] == [2]
    with pytest.raises(InvalidInput):
        every_turn(CHAT, roles=["robot"])


def test_the_conversation_endpoint_answers_every_turn_in_one_batch(server: LiveServer) -> None:
    fake = server.classifier
    assert isinstance(fake, FakeClassifier)
    before = len(fake.batches)
    r = post(server, "/v1/classify/conversation", {"messages": CHAT})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [(x["index"], x["role"], x["label"]) for x in results] == [
        (1, "user", "SAFE"),
        (2, "assistant", "OFFENSIVE"),
        (3, "user", "SAFE"),
    ]
    assert results[2]["score"] == pytest.approx(0.15)  # the idiot of turn 2 is its history
    assert len(fake.batches) - before == 1 and len(fake.batches[-1]) == 3  # one batch through the batcher
    # each turn answers what /v1/classify answers for the messages up to it
    alone = post(server, "/v1/classify", {"messages": CHAT[:4]}).json()
    assert alone["score"] == pytest.approx(results[2]["score"])
    only = post(server, "/v1/classify/conversation", {"messages": CHAT, "roles": ["assistant"]}).json()["results"]
    assert [x["index"] for x in only] == [2]
    turns = post(server, "/v1/classify/conversation", {"turns": ["hi", {"speaker": "B", "text": "you idiot"}]})
    assert [(x["index"], x["role"], x["label"]) for x in turns.json()["results"]] == [
        (0, "", "SAFE"),
        (1, "B", "OFFENSIVE"),
    ]


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"messages": CHAT, "turns": ["x"]}, "invalid_request", "messages"),
        ({}, "invalid_request", "messages"),
        ({"messages": [*CHAT, {"role": "user", "content": "y" * 4001}]}, "utterance_too_long", "messages[4].content"),
        ({"turns": ["hi", "y" * 4001, "ok"]}, "utterance_too_long", "turns[1]"),
        ({"messages": CHAT, "roles": ["robot"]}, "invalid_message", "roles"),
        ({"messages": [{"role": "system", "content": "x"}]}, "invalid_message", "messages"),
        ({"messages": CHAT, "bogus": 1}, "unknown_field", "bogus"),
        ({"turns": []}, "invalid_request", "turns"),
        ({"messages": [{"role": ["user"], "content": "hi"}]}, "invalid_message", "messages[0].role"),
    ],
)
def test_a_conversation_that_cannot_be_judged_is_refused_naming_the_field(
    server: LiveServer, body: Any, code: str, field: str
) -> None:
    r = post(server, "/v1/classify/conversation", body)
    assert r.status_code == 422, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["field"]) == (code, field)


def test_the_client_and_the_python_api_judge_every_turn(server: LiveServer, tiny_model_dir: Path) -> None:
    over_http = Client(server.url).classify_conversation(CHAT, roles=["user", "assistant"])
    assert [(t.index, t.role, t.prediction.label.value) for t in over_http] == [
        (1, "user", "SAFE"),
        (2, "assistant", "OFFENSIVE"),
        (3, "user", "SAFE"),
    ]
    model = dialogue_safety.load(tiny_model_dir)
    local = dialogue_safety.classify_conversation(CHAT, model)
    assert [t.index for t in local] == [1, 2, 3]
    last = dialogue_safety.classify_messages(CHAT, model)
    assert local[-1].prediction.score == pytest.approx(last.score, abs=1e-6)
    plain = dialogue_safety.classify_conversation(["hi", Turn("you idiot", "B")], model)
    assert [(t.index, t.role) for t in plain] == [(0, ""), (1, "B")]
    assert "classify_conversation" in dialogue_safety.__all__


def test_score_every_turn_writes_each_transcripts_turns(tiny_model_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "chats.jsonl"
    rows = [{"id": "a", "messages": CHAT}, {"id": "b", "messages": TOOL_TRANSCRIPT}, {"id": "c", "utterance": "hi"}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "scored.jsonl"
    argv = ["score", str(source), str(out), "--model", str(tiny_model_dir), "--variant", "fp32", "--no-progress"]
    assert cli_main([*argv, "--every-turn", "--roles", "assistant"]) == 0
    a, b, c = (json.loads(line) for line in out.read_text(encoding="utf-8").splitlines())
    assert [(t["index"], t["role"]) for t in a["turns"]] == [(2, "assistant")]
    assert [(t["index"], t["role"]) for t in b["turns"]] == [(4, "assistant")]  # the tool call is never judged
    assert b["turns"][0]["score"] == pytest.approx(b["score"])  # the last message: the record's own verdict
    assert c["turns"] is None and c["label"] in ("SAFE", "OFFENSIVE")
    assert (
        cli_main(["score", str(source), str(tmp_path / "x.jsonl"), "--roles", "assistant"]) == 2
    )  # needs --every-turn


def test_the_conversation_benchmark_runs_and_reports_each_way(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lab.bench.conversation import main as bench

    out = tmp_path / "bench.json"
    argv = ["--model", str(tiny_model_dir), "--variant", "fp32", "--turns", "4", "--rounds", "1", "--json", str(out)]
    assert bench(argv) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert set(report["ways"]) == {"conversation", "sequential", "concurrent"}
    assert report["ways"]["sequential"]["requests"] == 4 and report["ways"]["conversation"]["requests"] == 1
    assert report["ways"]["sequential"]["max_abs_score_diff_vs_one_call"] < 1e-3  # the same turns, the same answers
    assert "| conversation | 1 |" in capsys.readouterr().out
