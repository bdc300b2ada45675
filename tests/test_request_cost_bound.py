"""Cheap before costly: a request's counts are checked from the raw JSON before any element is validated,
and what it can cost is bounded from its characters before it is tokenised (docs/service.md, "Admission")."""

from __future__ import annotations

import json
import random
import re
import tracemalloc
from collections.abc import Sequence
from pathlib import Path

import pytest
from service_conftest import FakeClassifier, live_server
from tokenizers import Tokenizer

from dialogue_safety.core.encoding import (
    DialogueEncoder,
    EncodedExample,
    EncodingConfig,
    window_spans,
    windows_at_most,
)
from dialogue_safety.core.limits import CostBound, Limits, expansion, text_tokens_at_most
from dialogue_safety.core.schema import Example, Turn
from dialogue_safety.service import json_body
from dialogue_safety.service.json_body import problem_of
from dialogue_safety.service.limits import check_counts, scan_counts

MODEL_TOKENIZER = Path(__file__).resolve().parents[1] / "models" / "default" / "tokenizer.json"
LIMITS = Limits()


def _texts(seed: int) -> list[str]:
    """Texts that tokenise into many pieces per character: punctuation runs, single letters, emoji,
    compatibility characters, look-alikes, digits, scripts outside the vocabulary, very long words."""
    rng = random.Random(seed)
    alphabet = ["x", "q", "!", ".", ",", "1", "a ", "😂", "🫰", "\ufdfa", "ﬃ", "і", "€", "中", " ", "\u200b", "🇮🇩", "é"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 900))) for _ in range(60)]
    texts += ["!" * 700, "😂" * 300, "\ufdfa" * 200, "a " * 400, "x" * 450, "1,2." * 150, "q" * 250 + " " + "z" * 3]
    return texts


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    if not MODEL_TOKENIZER.exists():
        pytest.skip("the shipped model's tokenizer.json is not in this checkout")
    return Tokenizer.from_file(str(MODEL_TOKENIZER))


@pytest.mark.parametrize("mode", ["segments", "decomposed", "utterance_only"])
def test_the_bound_is_never_below_the_real_cost(tokenizer: Tokenizer, mode: str) -> None:
    config = EncodingConfig(context_mode=mode, normalise_obfuscation=True, speaker_markers=mode == "segments")
    encoder = DialogueEncoder(tokenizer, config)
    bound = CostBound(config, max_windows=32)
    texts = _texts(7)
    rng = random.Random(3)
    examples = [Example(utterance=t) for t in texts]
    examples += [
        Example(utterance=t, history=tuple(Turn(rng.choice(texts), rng.choice([None, "bot"])) for _ in range(3)))
        for t in texts
    ]
    encoded = encoder.encode_batch(examples, max_windows=32)
    for example, enc in zip(examples, encoded, strict=True):
        if enc.read.windows_needed > enc.read.windows:
            continue  # refused (too_many_windows), never charged
        assert enc.tokens <= bound.example(example), (example, enc.tokens)


def test_one_character_never_becomes_more_tokens_than_the_bound_says(tokenizer: Tokenizer) -> None:
    config = EncodingConfig(normalise_obfuscation=True)
    encoder = DialogueEncoder(tokenizer, config)
    chars = ["😂", "🫰", "\ufdfa", "ﬃ", "㍻", "👨‍👩‍👧", "1️⃣", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "中", "é"]
    for c in chars:
        [enc] = encoder.encode_batch([Example(utterance=c)])
        assert len(enc) - 3 <= text_tokens_at_most(c), c
    assert 18 <= expansion() <= 64  # U+FDFA's 18 characters; an emoji's name (34 today)


@pytest.mark.parametrize("n", [0, 1, 95, 96, 97, 125, 126, 300, 1000, 4001])
def test_windows_at_most_bounds_window_spans(n: int) -> None:
    rng = random.Random(n)
    for width in (96, 125):
        for _ in range(20):
            continuation = __import__("numpy").array([rng.random() < 0.6 for _ in range(n)], dtype=bool)
            spans, needed = window_spans(continuation, width, None)
            assert needed == len(spans) <= windows_at_most(n, width)


def test_prose_is_bounded_within_a_few_times_its_cost(tokenizer: Tokenizer) -> None:
    """What the bound costs honest requests: ordinary English is refused too costly by its bound at most
    a few times sooner than by its real cost (the figure is in docs/service.md)."""
    config = EncodingConfig(context_mode="decomposed", normalise_obfuscation=True)
    encoder = DialogueEncoder(tokenizer, config)
    bound = CostBound(config, max_windows=32)
    words = [
        "you",
        "said",
        "that",
        "the",
        "soup",
        "was",
        "good",
        "but",
        "honestly",
        "I",
        "think",
        "it",
        "tasted",
        "like",
        "nothing",
        "at",
        "all",
    ]
    rng = random.Random(5)
    examples = [Example(utterance=" ".join(rng.choice(words) for _ in range(n))) for n in (5, 20, 80, 300)]
    examples.append(Example(utterance="thanks, you too", history=(Turn("have a nice day"), Turn("see you"))))
    ratio = bound(examples) / sum(e.tokens for e in encoder.encode_batch(examples, max_windows=32))
    assert 1 <= ratio <= 6  # 4.7 here: words of ~4 letters are bounded at one token a letter


# -- counts from the raw JSON ----------------------------------------------------------------------------


def _refusal(body: object, limits: Limits = LIMITS) -> tuple[str, str | None] | None:
    problem = problem_of(json.dumps(body).encode(), limits)
    return None if problem is None else (problem.code, problem.field)


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        ({"input": [0] * 257}, ("too_many_items", "input")),
        ({"items": [0] * 257}, ("too_many_items", "items")),
        ({"utterance": "x", "history": ["a"] * 33}, ("too_many_history_turns", "history")),
        ({"messages": [{"role": "user", "content": "a"}] * 34}, ("too_many_history_turns", "messages")),
        ({"input": "x", "conversation": [{}] * 33}, ("too_many_history_turns", "conversation")),
        ({"items": [{"utterance": "x", "history": ["a"] * 258}]}, ("too_many_history_turns", "items[0].history")),
        ({"items": [{"messages": [{"role": "user", "content": [{}] * 300}]}]}, None),
        ({"utterance": "x", **{f"k{i}": 0 for i in range(257)}}, ("invalid_request", None)),
        ({"utterance": "x", "k" * 65: 0}, None),  # a long unknown key: the schema's error, not a count
        ({"input": [0] * 256}, None),
        ({"items": [{"utterance": "x", "history": ["a"] * 33}]}, None),  # reported in its own slot, as before
        ([0] * 300, ("too_many_items", None)),
    ],
)
def test_counts_are_refused_from_the_raw_json(body: object, refused: tuple[str, str | None] | None) -> None:
    if body == {"items": [{"messages": [{"role": "user", "content": [{}] * 300}]}]}:
        refused = ("too_many_items", "items[0].messages[0].content")
    assert _refusal(body) == refused


def test_a_million_invalid_items_are_refused_without_looking_at_them() -> None:
    class Counting(list[object]):
        looked = 0

        def __iter__(self):  # type: ignore[no-untyped-def]
            Counting.looked += 1
            return super().__iter__()

    data = {"input": Counting([0] * 1_000_000)}
    error = check_counts(data, LIMITS)
    assert error is not None and error.code == "too_many_items" and "256" in error.message
    assert Counting.looked == 0  # no element was looked at


def test_a_million_invalid_items_allocate_about_what_their_body_holds() -> None:
    body = json.dumps({"input": [0] * 1_000_000}).encode()
    tracemalloc.start()
    try:
        problem = problem_of(body, LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert problem is not None and problem.code == "too_many_items"
    assert peak < 5 * len(body)  # the parsed list (8 bytes an element), never an error object per element


def test_only_api_bodies_are_counted() -> None:
    assert problem_of(json.dumps({"items": [0] * 300}).encode(), None) is None


# -- against a real server ------------------------------------------------------------------------------


class CountingClassifier(FakeClassifier):
    """The fake classifier, counting the examples it was asked to encode (tokenise)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        self.encoded += len(examples)
        return super().encode(examples)


def test_a_request_too_costly_by_its_characters_is_refused_untokenised() -> None:
    classifier = CountingClassifier()
    # one request may cost half of 4,096: 2,048 model tokens; 64 items of 400 letters can cost 64 x 128
    with live_server(classifier=classifier, max_pending_tokens=4096) as live, live.client() as c:
        ok = c.post("/v1/classify/batch", json={"items": ["you are nice"] * 8})
        assert ok.status_code == 200, ok.text
        before = classifier.encoded
        r = c.post("/v1/classify/batch", json={"items": ["x" * 400] * 64})
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["code"] == "request_too_costly" and "2048" in error["message"]
        assert "by its characters" in error["message"]
        m = c.post("/v1/moderations", json={"input": ["x" * 400] * 64})
        assert m.status_code == 413 and m.json()["error"]["code"] == "request_too_costly"
        assert classifier.encoded == before  # neither was tokenised
        assert c.post("/v1/classify/batch", json={"items": ["you are nice"] * 8}).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/moderations", {"input": [0] * 1_000_000}, "input"),
        ("/v1/classify/batch", {"items": [0] * 1_000_000}, "items"),
        ("/v1/classify", {"utterance": "x", "history": [0] * 1_000_000}, "history"),
        ("/v1/classify", {"messages": [0] * 1_000_000}, "messages"),
        ("/v1/classify", {"utterance": "x", "explain": True, "history": [0] * 1_000_000}, "history"),
    ],
)
def test_a_million_invalid_elements_are_one_error_naming_the_field_and_limit(
    path: str, body: dict[str, object], field: str
) -> None:
    classifier = CountingClassifier()
    with live_server(classifier=classifier) as live, live.client() as c:
        raw = json.dumps(body, separators=(",", ":")).encode()  # 2 MB, within SAFETY_MAX_BODY_BYTES
        r = c.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code in (400, 422), r.text
        error = r.json()["error"]
        assert str(error.get("param", error.get("field"))) == field
        assert "1000000" in error["message"] and any(f" {n} " in error["message"] for n in (256, 32, 33))
        assert classifier.encoded == 0
        assert live.app.state.safety.settings.max_body_bytes >= len(raw)
        assert c.get("/health").status_code == 200


def test_a_request_level_list_of_a_million_scalars_is_refused_from_the_bytes_unparsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsed: list[int] = []
    real = json_body.json.loads
    monkeypatch.setattr(json_body.json, "loads", lambda *a, **k: parsed.append(1) or real(*a, **k))
    for body, refused in [
        ({"input": [0] * 1_000_000}, ("too_many_items", "input")),
        ({"utterance": "x", "history": [None] * 600_000}, ("too_many_history_turns", "history")),
        ({"messages": [{}] * 600_000}, ("too_many_history_turns", "messages")),
    ]:
        raw = json.dumps(body, separators=(",", ":")).encode()
        tracemalloc.start()
        try:
            problem = problem_of(raw, LIMITS)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert problem is not None and (problem.code, problem.field) == refused
        assert str(len(next(iter(v for v in body.values() if isinstance(v, list))))) in problem.message
        assert peak < 64 * 1024  # nothing the size of the body was built
    assert parsed == []  # never parsed


@pytest.mark.parametrize(
    "body",
    [
        {"utterance": '"items":[' + ",0" * 300, "history": []},  # the key inside a string
        {"items": [{"history": [0] * 300}]},  # deeper than the top-level object
        {"input": ["a"] * 300},  # strings: counted once parsed
        {"items": [[0]] * 300},
        {"input": [0] * 300, "x": 1},
    ],
)
def test_the_scan_of_the_bytes_agrees_with_the_count_of_the_parsed_body(body: object) -> None:
    raw = json.dumps(body).encode()
    scanned = scan_counts(raw, LIMITS)
    counted = check_counts(json.loads(raw), LIMITS)
    if scanned is not None:  # what the scan finds, the count finds the same way
        assert counted is not None and (scanned.code, scanned.field, scanned.message) == (
            counted.code,
            counted.field,
            counted.message,
        )
    assert (problem_of(raw, LIMITS) is None) == (counted is None)


def test_the_nginx_examples_wait_longer_than_the_published_admission_bound() -> None:
    """docs/api.md's nginx examples: ``proxy_read_timeout`` is one value, longer than the slowest accepted
    request's bound that lab/notes/abuse.md publishes (the budget's work at the measured throughput plus one
    batch, under 4x overload): shorter, nginx answers 504 for requests the service admitted and answers."""
    root = Path(__file__).resolve().parents[1]
    api = (root / "docs" / "api.md").read_text(encoding="utf-8")
    timeouts = {int(t) for t in re.findall(r"proxy_read_timeout (\d+)s;", api)}
    notes = (root / "lab" / "notes" / "abuse.md").read_text(encoding="utf-8")
    bounds = [
        float(b.replace(",", "")) + float(batch)
        for b, batch in re.findall(r"bound ([\d,]+) \+ batch ([\d.]+) ms", notes)
    ]
    assert len(timeouts) == 1 and bounds
    assert timeouts.pop() * 1000 > max(bounds)
