"""Cheap before costly: a request's counts are checked from the raw JSON before any element is validated,
and what it can cost is bounded from its characters before it is tokenised (docs/service.md, "Admission")."""

from __future__ import annotations

import json
import random
import re
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from service_conftest import FakeClassifier, live_server
from tokenizers import Tokenizer

from dialogue_safety.core.encoding import (
    DialogueEncoder,
    EncodedExample,
    EncodingConfig,
    normalise_text,
    window_spans,
    windows_at_least,
    windows_at_most,
)
from dialogue_safety.core.limits import (
    CostBound,
    Limits,
    TokenizerWords,
    expansion,
    text_tokens_at_least,
    text_tokens_at_most,
)
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import Example, Turn
from dialogue_safety.service import json_body
from dialogue_safety.service.json_body import problem_of
from dialogue_safety.service.limits import check_counts, scan_counts
from dialogue_safety.service.settings import ServiceSettings

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
def test_windows_at_most_and_at_least_bound_window_spans(n: int) -> None:
    rng = random.Random(n)
    for width in (96, 125):
        for _ in range(20):
            continuation = __import__("numpy").array([rng.random() < 0.6 for _ in range(n)], dtype=bool)
            spans, needed = window_spans(continuation, width, None)
            assert windows_at_least(n, width) <= needed == len(spans) <= windows_at_most(n, width)


# -- what a text costs at least ---------------------------------------------------------------------------
PROSE = [
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
    "and",
    "the",
    "waiter",
    "never",
    "came",
    "back",
    "to",
    "our",
    "table",
    "so",
    "we",
    "left",
    "early",
    "without",
    "paying",
    "for",
    "dessert",
]


def _hostile_text(rng: random.Random) -> str:
    """Prose, punctuation, emoji, CJK, long words, URLs, whitespace runs, NFKC-expanding characters and the
    disguises the obfuscation rules undo (spaced, stretched, swapped letters), mixed at random."""
    pieces = [
        lambda: rng.choice(PROSE),
        lambda: rng.choice(PROSE).capitalize() + rng.choice([",", ".", "!", "?", "..."]),
        lambda: rng.choice(["😂", "🫰", "👨‍👩‍👧", "1️⃣", "🇮🇩", "🏴󠁧󠁢󠁥󠁮󠁧󠁿"]) * rng.randint(1, 3),
        lambda: "".join(rng.choice("中文字漢語日本") for _ in range(rng.randint(1, 12))),
        lambda: "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(19, 400))),
        lambda: f"https://example.com/{rng.choice(PROSE)}/{rng.randint(0, 10**6)}?q={rng.choice(PROSE)}&x=1",
        lambda: rng.choice([" " * rng.randint(2, 40), "\n\n\t", "\u3000", "\u00a0", "\u200b", "\u2028"]),
        lambda: rng.choice(["\ufdfa", "ﬃ", "㍻", "①", "ｉｄｉｏｔ", "і" + "dіоt", "é", "e\u0301"]),
        lambda: " ".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))),
        lambda: rng.choice(["f.u.c.k", "i-d-i-o-t", "stuuuuupid", "sooooo", "sh1t", "a$$hole", "h473$", "n00b"]),
        lambda: rng.choice(["covid19", "10am", "3rd", "mp3", "x" * 101, "ab" * 60, "coooool", "www"]),
    ]
    parts = [rng.choice(pieces)() for _ in range(rng.randint(1, 120))]
    return "".join(p + rng.choice([" ", " ", " ", "", "  "]) for p in parts)


@pytest.mark.parametrize("obfuscation", [True, False])
def test_a_text_never_costs_fewer_tokens_than_its_lower_bound_says(tokenizer: Tokenizer, obfuscation: bool) -> None:
    """Randomized, on real tokenisation: the lower bound is never above the real count of tokens (nor the
    upper bound, with the vocabulary's words, below it), whatever the text."""
    config = EncodingConfig(normalise_obfuscation=obfuscation)
    words = TokenizerWords.of(tokenizer)
    assert words.known and words.lowercase and words.chinese and "the" in words.whole
    rng = random.Random(11 + obfuscation)
    texts = [_hostile_text(rng) for _ in range(400)]
    texts += [" ".join(rng.choice(PROSE) for _ in range(700)), "中" * 300, "x" * 4000, "a " * 2000]
    real = [
        len(e.ids) for e in tokenizer.encode_batch([normalise_text(t, config) for t in texts], add_special_tokens=False)
    ]
    for text, n in zip(texts, real, strict=True):
        assert text_tokens_at_least(text, words) <= n <= text_tokens_at_most(text, words), text
    prose = " ".join(rng.choice(PROSE) for _ in range(700))
    real_prose = len(tokenizer.encode(prose, add_special_tokens=False).ids)
    assert 0.9 * real_prose <= text_tokens_at_least(prose, words) <= real_prose  # one-letter words go uncounted


def test_an_unknown_tokenizer_gives_no_lower_bound() -> None:
    assert text_tokens_at_least("plenty of words here", TokenizerWords(known=False)) == 0
    assert text_tokens_at_least("plenty of words here", None) == 0


@pytest.mark.parametrize("mode", ["segments", "decomposed", "utterance_only"])
def test_an_example_never_costs_less_than_its_lower_bound_and_a_cut_one_costs_nothing(
    tokenizer: Tokenizer, mode: str
) -> None:
    """The cost of an encoded example (what admission charges) is at least :meth:`CostBound.example_at_least`;
    an utterance refused for needing more than ``max_windows`` windows is charged nothing, and its lower bound
    is 0 too (it is counted only when its windows surely fit)."""
    config = EncodingConfig(context_mode=mode, normalise_obfuscation=True, speaker_markers=mode == "segments")
    encoder = DialogueEncoder(tokenizer, config)
    bound = CostBound(config, max_windows=8, words=TokenizerWords.of(tokenizer))
    rng = random.Random(17)
    texts = [_hostile_text(rng) for _ in range(150)] + [
        " ".join(rng.choice(PROSE) for _ in range(n)) for n in (90, 500)
    ]
    examples = [Example(utterance=t) for t in texts]
    examples += [Example(utterance=t, history=(Turn(rng.choice(texts), "bot"),)) for t in texts[:60]]
    for example, enc in zip(examples, encoder.encode_batch(examples, max_windows=8), strict=True):
        least = bound.example_at_least(example)
        if enc.read.windows_needed > enc.read.windows:
            assert least == 0, example
            continue
        assert least <= enc.tokens, (example, least, enc.tokens)
    prose = [Example(utterance=" ".join(rng.choice(PROSE) for _ in range(n))) for n in (5, 90, 500)]
    for example, enc in zip(prose, encoder.encode_batch(prose, max_windows=8), strict=True):
        assert 0.7 * enc.tokens <= bound.example_at_least(example) <= enc.tokens  # not vacuous on prose


def test_prose_is_bounded_within_a_few_times_its_cost(tokenizer: Tokenizer) -> None:
    """What the bound costs honest requests: ordinary English is refused too costly by its bound at most
    a few times sooner than by its real cost (the figure is in docs/service.md)."""
    config = EncodingConfig(context_mode="decomposed", normalise_obfuscation=True)
    encoder = DialogueEncoder(tokenizer, config)
    bound = CostBound(config, max_windows=32)
    words = PROSE[:17]  # "you said that ... at all"
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


def _problem_and_peak(body: bytes) -> tuple[Any, int]:
    """``problem_of(body)`` and the peak of the memory it allocated (tracemalloc)."""
    tracemalloc.start()
    try:
        problem = problem_of(body, LIMITS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return problem, peak


def test_a_million_invalid_items_allocate_about_what_their_body_holds() -> None:
    body = json.dumps({"input": [0] * 1_000_000}).encode()
    problem, peak = _problem_and_peak(body)
    assert problem is not None and problem.code == "too_many_items"
    assert peak < 5 * len(body)  # the parsed list (8 bytes an element), never an error object per element


def test_only_api_bodies_are_counted() -> None:
    assert problem_of(json.dumps({"items": [0] * 300}).encode(), None) is None


# -- against a real server ------------------------------------------------------------------------------


class CountingClassifier(FakeClassifier):
    """The fake classifier with the shipped model's encoding (its tokenizer and encoding settings: what the
    service reads the lower bound from), counting the examples it was asked to encode (tokenise)."""

    def __init__(self) -> None:
        super().__init__()
        if not MODEL_TOKENIZER.exists():
            pytest.skip("the shipped model's tokenizer.json is not in this checkout")
        card = json.loads((MODEL_TOKENIZER.parent / "model_card.json").read_text(encoding="utf-8"))
        self.card = ModelCard(
            name="fake",
            version="1.2.3",
            heads=list(self.card.heads),
            score_heads=["offensive"],
            encoding=card["encoding"],
        )
        self.encoder = DialogueEncoder(Tokenizer.from_file(str(MODEL_TOKENIZER)), self.card.encoding_config)
        self.encoded = 0

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        self.encoded += len(examples)
        return self.encoder.encode_batch(examples, ServiceSettings().max_windows)


def _prose(chars: int, seed: int) -> str:
    """English prose of at most ``chars`` characters, cut at a space."""
    rng = random.Random(seed)
    text = " ".join(rng.choice(PROSE) + rng.choice(["", "", "", ",", "."]) for _ in range(chars))
    return text[: text.rfind(" ", 0, chars + 1)]


def test_admission_refuses_only_what_surely_costs_too_much_and_tokenises_nothing_it_refuses() -> None:
    """Three bands, by the characters of a batch of 4,000-character prose items: what fits by its real cost is
    admitted and answered though one token per character says it might not (the rule before this one
    refused it); what costs too much even at least is refused 413 before any tokenisation; the issue's 1 MB
    batch of ``max_batch_items`` such items is of the second kind."""
    classifier = CountingClassifier()
    settings = ServiceSettings()
    limit = settings.max_pending_tokens // 2  # what one request may cost
    config = classifier.card.encoding_config
    text = _prose(LIMITS.max_utterance_chars, seed=1)
    item = Example(utterance=text)
    real = classifier.encoder.encode_batch([item], settings.max_windows)[0].tokens
    fits = min(LIMITS.max_batch_items, limit // real)
    loose = CostBound(config, settings.max_windows)  # one token a character: what the rule before decided on
    words = TokenizerWords.of(classifier.encoder.tokenizer)
    assert loose([item] * fits) > limit  # so the rule before refused it
    assert CostBound(config, settings.max_windows, words).at_least([item] * fits) <= limit
    assert CostBound(config, settings.max_windows, words).at_least([item] * LIMITS.max_batch_items) > limit
    texts = [_prose(LIMITS.max_utterance_chars, seed=i) for i in range(LIMITS.max_batch_items)]
    # one client sends several refused large bodies in a row here: no pause between them (LargeBodies)
    with live_server(classifier=classifier, refused_body_share=1.0) as live, live.client() as c:
        ok = c.post("/v1/classify/batch", json={"items": [text] * fits})
        assert ok.status_code == 200, ok.text
        assert len(ok.json()["results"]) == fits and all("label" in r for r in ok.json()["results"])
        assert classifier.encoded == fits
        r = c.post("/v1/classify/batch", json={"items": texts})  # ~1 MB
        assert r.status_code == 413, r.text
        error = r.json()["error"]
        assert error["code"] == "request_too_costly" and str(limit) in error["message"]
        assert "at least" in error["message"] and "by its characters" in error["message"]
        m = c.post("/v1/moderations", json={"input": texts})
        assert m.status_code == 413 and m.json()["error"]["code"] == "request_too_costly"
        assert classifier.encoded == fits  # neither was tokenised
        # between the bands: more items than fit by their real cost, but not surely by their characters
        between = fits + 1
        assert CostBound(config, settings.max_windows, words).at_least([item] * between) <= limit < real * between
        b = c.post("/v1/classify/batch", json={"items": [text] * between})
        assert b.status_code == 413 and "costs " + str(real * between) in b.json()["error"]["message"]
        assert classifier.encoded == fits + between  # tokenised, then refused on its real cost
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
        problem, peak = _problem_and_peak(raw)
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
