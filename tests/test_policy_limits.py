"""Policy rules that cannot hang and a reload that reads only policy files (issue: hardening, round three).

* Regexes are compiled by RE2 (linear time): a nested-quantifier pattern loads and answers on a long
  text; a pattern RE2 cannot run in linear time (lookaround, a backreference) is refused at load with
  file and line.
* Block terms are one token automaton: its answers equal the whole-word regex's on random texts and
  rules, a large list keeps the first rule first, and its work per text is counted in tokens, not terms.
* The service matches texts off the event loop, in the request's work.
* ``POST /admin/policy`` loads only the start-up file or files in ``SAFETY_POLICY_DIR``; a FIFO,
  ``/dev/zero``, a path outside, a NUL byte, a lone surrogate, a newline: a 4xx JSON error that quotes
  nothing of any file, and log lines that escape what the client sent.

Speed is measured by ``python -m lab.bench abuse`` (lab/notes/abuse.md), never asserted here.
"""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import gc
import logging
import os
import pickle
import random
import re
import threading
import weakref
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_conftest import FakeClassifier, LiveServer, live_server

from dialogue_safety.core import policy as policy_module
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import PolicyError, load_policy, parse_policy, read_policy_file
from dialogue_safety.core.schema import Example, Label, Prediction

CARD = ModelCard(heads=["offensive"], score_heads=["offensive"])
NESTED = r"(\w+\s?)+[!?.]{3,}$"  # the backtracking engine's catastrophe: exponential in the words before the end
KEY = "test-key-policy"


def low() -> Prediction:
    return Prediction(score=0.1, label=Label.SAFE, threshold=0.5, categories={"offensive": 0.1})


# -- regexes -------------------------------------------------------------------------------------------
def test_a_nested_quantifier_pattern_loads_and_answers_on_a_long_text() -> None:
    policy = parse_policy(f"[[block]]\nname = \"shouting\"\nregexes = ['{NESTED}']\n")
    long_miss = "word " * 800  # 4,000 characters that never end in "...": Python's re would not return
    assert policy.apply(Example(utterance=long_miss), low(), CARD).policy is None
    hit = policy.apply(Example(utterance="word " * 800 + "now!!!"), low(), CARD)
    assert (hit.label, hit.policy) == (Label.OFFENSIVE, "shouting")


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"(?<!\w)scam", "lookaround and backreferences are not supported"),
        (r"(?=scam)scam", "lookaround and backreferences are not supported"),
        (r"(a+)\1", "lookaround and backreferences are not supported"),
        (r"(", "is not a valid regex"),
    ],
)
def test_a_pattern_without_a_linear_time_match_is_refused_with_file_and_line(
    tmp_path: Path, pattern: str, words: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(f'[[block]]\nname = "a"\nterms = ["x"]\n\n[[block]]\nname = "b"\nregexes = [\'{pattern}\']\n')
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}:7: block[1].regexes[0] "), str(caught.value)
    assert words in caught.value.problem


def test_regexes_are_case_insensitive_on_the_normalised_text() -> None:
    policy = parse_policy("[[block]]\nname = \"scams\"\nregexes = ['\\bscam+y?\\b']\n")
    for text, hit in (("So SCAMMY!", True), ("ｓｃａｍ", True), ("scampi", False)):
        assert (policy.apply(Example(utterance=text), low(), CARD).policy == "scams") is hit, text


# -- block terms -----------------------------------------------------------------------------------------
def _by_regex(rules: list[list[str]], text: str) -> int | None:
    """The first rule whose terms the old matcher (Python's whole-word alternation) finds in ``text``."""
    for i, terms in enumerate(rules):
        alternatives = "|".join(re.escape(t) for t in sorted(set(terms), key=len, reverse=True))
        if re.search(rf"(?<!\w)(?:{alternatives})(?!\w)", text):
            return i
    return None


def test_the_term_automaton_answers_as_the_whole_word_regex_does() -> None:
    rng = random.Random(7)
    alphabet = ["a", "b", "ab", " ", "!", "-", "é", "_", "1"]  # word and non-word characters, runs of both

    def text(k: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(k))

    for _ in range(2000):
        rules = [[t for t in (text(rng.randint(1, 4)) for _ in range(rng.randint(1, 3))) if t.strip()] or ["a"]]
        rules += [[text(rng.randint(1, 3)).strip() or "b"] for _ in range(rng.randint(0, 2))]
        probe = text(rng.randint(0, 14))
        index = policy_module._TermIndex(rules)
        assert index.first_rule(probe) == _by_regex(rules, probe), (rules, probe)


def test_a_large_term_list_keeps_whole_words_and_the_first_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    terms = [f"term{i:05d}" for i in range(20_000)]
    toml = '[[block]]\nname = "first"\nterms = ["snake oil"]\n\n'
    toml += '[[block]]\nname = "big"\nterms = [' + ", ".join(f'"{t}"' for t in terms) + ', "snake oil"]\n'
    policy = parse_policy(toml)
    assert policy.apply(Example(utterance="see TERM19999."), low(), CARD).policy == "big"
    assert policy.apply(Example(utterance="see term19999x"), low(), CARD).policy is None  # whole words only
    assert policy.apply(Example(utterance="term00000 and snake  oil"), low(), CARD).policy == "first"
    # the work per text: one goto look-up per token at most (plus failure links), whatever the list's size
    looked: list[int] = []
    real = policy_module._TOKENS

    class Counting:
        def findall(self, text: str) -> list[str]:
            tokens = real.findall(text)
            looked.append(len(tokens))
            return tokens

    compiled = policy_module._compiled(policy, CARD.encoding_config)
    monkeypatch.setattr(policy_module, "_TOKENS", Counting())
    goto = compiled.terms.goto
    gets = 0

    class CountingGoto(dict):  # type: ignore[type-arg]
        def get(self, key: Any, default: Any = None) -> Any:
            nonlocal gets
            gets += 1
            return goto.get(key, default)

        def __contains__(self, key: object) -> bool:
            nonlocal gets
            gets += 1
            return key in goto

    monkeypatch.setattr(compiled.terms, "goto", CountingGoto(goto))
    words = " ".join(f"word{i}" for i in range(500))
    assert compiled.terms.first_rule(words) is None
    assert looked == [999] and gets <= 2 * looked[0]


def test_a_replaced_policy_takes_its_automaton_with_it() -> None:
    """The matching structures live on the policy: a reload (a new policy) frees the old one's, however
    many reloads there are; a pickled policy (a Ray actor's) builds its own."""
    policy = parse_policy('[[block]]\nname = "a"\nterms = ["snake oil"]\n')
    built = weakref.ref(policy_module._compiled(policy, CARD.encoding_config).terms)
    copy = pickle.loads(pickle.dumps(policy))
    assert copy.apply(Example(utterance="snake oil!"), low(), CARD).policy == "a"
    del policy
    gc.collect()
    assert built() is None


# -- off the event loop -----------------------------------------------------------------------------------
def test_the_service_matches_policy_texts_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[[block]]\nname = "no-fruit"\nterms = ["banana"]\n', encoding="utf-8")
    threads: list[str] = []
    match = policy_module.Policy.match

    def recording(self: policy_module.Policy, utterance: str, card: ModelCard) -> Any:
        threads.append(threading.current_thread().name)
        return match(self, utterance, card)

    monkeypatch.setattr(policy_module.Policy, "match", recording)
    with live_server(classifier=FakeClassifier(), policy=path) as live, live.client() as c:
        one = c.post("/v1/classify", json={"utterance": "a banana"}).json()
        batch = c.post("/v1/classify/batch", json={"items": ["banana", "hello"]}).json()
        moderated = c.post("/v1/moderations", json={"input": ["banana", "hi"]}).json()
        loop_thread = live.thread.name
    assert one["policy"] == "no-fruit" and [r.get("policy") for r in batch["results"]] == ["no-fruit", None]
    assert [r["flagged"] for r in moderated["results"]] == [True, False]
    assert len(threads) == 5 and loop_thread not in threads, threads


# -- reading a policy file ---------------------------------------------------------------------------------
def test_a_policy_file_is_a_regular_file_of_bounded_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(PolicyError, match="not a regular file"):
        read_policy_file(fifo)  # opened without waiting for a writer
    with pytest.raises(PolicyError, match="not a regular file"):
        read_policy_file("/dev/zero")
    with pytest.raises(PolicyError, match="not a regular file"):
        read_policy_file(tmp_path)
    with pytest.raises(PolicyError, match="cannot be read"):
        read_policy_file("a\x00b")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * 200 + "\n")
    monkeypatch.setattr(policy_module, "MAX_POLICY_BYTES", 100)
    with pytest.raises(PolicyError, match="larger than 100 bytes") as caught:
        read_policy_file(big)
    assert "xxx" not in str(caught.value)


# -- POST /admin/policy --------------------------------------------------------------------------------------
SECRET = 'password = "hunter2"\n'


@pytest.fixture()
def admin(tmp_path: Path) -> Any:
    start = tmp_path / "start" / "policy.toml"
    start.parent.mkdir()
    start.write_text('[[block]]\nname = "start"\nterms = ["banana"]\n', encoding="utf-8")
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "other.toml").write_text('[[block]]\nname = "other"\nterms = ["cherry"]\n', encoding="utf-8")
    os.mkfifo(policies / "fifo.toml")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.toml").write_text(SECRET, encoding="utf-8")
    (policies / "link.toml").symlink_to(outside / "secret.toml")
    with live_server(classifier=FakeClassifier(), api_key=KEY, policy=start, policy_dir=policies) as live:
        yield live, tmp_path


def reload(live: LiveServer, body: Any = None, raw: bytes | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    with httpx.Client(base_url=live.url, timeout=10) as c:
        if raw is not None:
            return c.post("/admin/policy", content=raw, headers=headers)
        return c.post("/admin/policy", json=body, headers=headers)


def test_the_reload_loads_the_start_up_file_and_files_in_the_policy_directory(admin: Any) -> None:
    live, root = admin
    relative = reload(live, {"path": "other.toml"})  # taken in SAFETY_POLICY_DIR
    assert relative.status_code == 200, relative.text
    assert relative.json()["policy"]["block"][0]["name"] == "other"
    back = reload(live, {"path": str(root / "start" / "policy.toml")})
    assert back.status_code == 200 and back.json()["policy"]["block"][0]["name"] == "start"
    again = reload(live)  # no body: the file in force, read again
    assert again.status_code == 200 and again.json()["policy"]["source"] == "policy.toml"  # its name: no path


@pytest.mark.parametrize(
    ("case", "body", "words"),
    [
        ("fifo", {"path": "fifo.toml"}, "not a regular file"),
        ("device", {"path": "/dev/zero"}, "SAFETY_POLICY_DIR"),
        ("outside", {"path": "../outside/secret.toml"}, "SAFETY_POLICY_DIR"),
        ("absolute outside", {"path": "{root}/outside/secret.toml"}, "SAFETY_POLICY_DIR"),
        ("link outside", {"path": "link.toml"}, "SAFETY_POLICY_DIR"),
        ("nul", {"path": "other\x00.toml"}, "control character"),
        ("newline", {"path": "other.toml\nINFO forged line"}, "control character"),
        ("empty", {"path": " "}, "the path is empty"),
    ],
)
def test_a_path_that_is_not_a_policy_file_gets_a_4xx_without_any_file_content(
    admin: Any, case: str, body: dict[str, str], words: str, caplog: pytest.LogCaptureFixture
) -> None:
    live, root = admin
    body = {"path": body["path"].replace("{root}", str(root))}
    with caplog.at_level(logging.INFO):
        answer = reload(live, body)
    assert 400 <= answer.status_code < 500, (case, answer.status_code, answer.text)
    error = answer.json()["error"]
    assert words in error["message"], (case, error)
    assert "hunter2" not in answer.text and "password" not in answer.text
    logged = [r.getMessage() for r in caplog.records if r.name == "dialogue_safety.service.policy_admin"]
    assert all("\n" not in m and "\x00" not in m for m in logged), logged  # escaped: no forged log line
    with live.client(headers={"Authorization": f"Bearer {KEY}"}) as c:  # the policy in force stayed
        assert c.get("/v1/model").json()["serving"]["policy"]["block"][0]["name"] == "start"


def test_a_lone_surrogate_in_the_path_gets_a_4xx(admin: Any) -> None:
    live, _ = admin
    answer = reload(live, raw=b'{"path": "other\\ud800.toml"}')
    assert 400 <= answer.status_code < 500 and "error" in answer.json(), answer.text
