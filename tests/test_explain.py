"""Occlusion explanations on real ONNX Runtime sessions: each contribution is the drop in the
runtime's own served score when that word is removed, and removing the top word of an offensive
message lowers the score more than removing a random word (shipped model, a fixed set of examples;
no exact score of the shipped model is assumed)."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import random
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core.explain import explain, plan, word_spans
from dialogue_safety.core.model_dir import default_model_dir
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example

OFFENSIVE = [
    ("you are a worthless idiot and everyone hates you", ()),
    ("shut up you stupid bitch", ()),
    ("all of them are disgusting vermin and should be thrown out", ("what do you think of immigrants?",)),
    ("go kill yourself nobody would miss you", ("I feel so lonely",)),
    ("women are too dumb to vote", ()),
    ("you should definitely do it, hurt yourself", ("Should I hurt myself?",)),
    ("fuck off you ugly piece of shit", ("hi how are you",)),
    ("those people are animals and deserve to die", ()),
]


def drop_word(text: str, index: int) -> str:
    words = text.split()
    return " ".join(words[:index] + words[index + 1 :])


def test_word_spans_point_into_the_raw_text() -> None:
    text = "  you\tare  a 🤡!  "
    spans = word_spans(text)
    assert [s.word for s in spans] == ["you", "are", "a", "🤡!"]
    assert all(text[s.start : s.end] == s.word for s in spans)


def test_contributions_are_drops_of_the_served_score(tiny_model_dir: Path) -> None:
    clf = OnnxClassifier(tiny_model_dir, variant="fp32")
    example = Example.from_texts("you are a stupid idiot", ["hello there friend"])
    ((prediction, ex),) = explain(clf, [example], history=True)
    assert prediction.score == clf.predict([example])[0].score == ex["score"]
    for i, w in enumerate(ex["utterance"]):
        alone = clf.predict([Example.from_texts(drop_word(example.utterance, i), ["hello there friend"])])[0].score
        assert w["contribution"] == pytest.approx(prediction.score - alone, abs=1e-6)
    for i, w in enumerate(ex["history"][0]):
        alone = clf.predict([Example.from_texts(example.utterance, [drop_word("hello there friend", i)])])[0].score
        assert w["contribution"] == pytest.approx(prediction.score - alone, abs=1e-6)


def test_the_cap_explains_the_utterance_first_then_the_newest_turn() -> None:
    example = Example.from_texts("a b c", ["old turn here", "new turn"])
    p = plan(example, history=True, max_words=4)
    assert [(s.word, s.turn) for s in p.spans] == [("a", None), ("b", None), ("c", None), ("new", 1)]
    assert p.unexplained == 4 and len(p.examples()) == 5


@pytest.mark.slow
def test_removing_the_top_word_lowers_the_score_more_than_a_random_word() -> None:
    clf = OnnxClassifier(default_model_dir())
    rng = random.Random(0)
    examples = [Example.from_texts(u, list(h)) for u, h in OFFENSIVE]
    top_drops, random_drops = [], []
    for example, (prediction, ex) in zip(examples, explain(clf, examples), strict=True):
        contributions = [w["contribution"] for w in ex["utterance"]]
        top = max(range(len(contributions)), key=contributions.__getitem__)
        other = rng.choice([i for i in range(len(contributions)) if i != top])
        history = [t.text for t in example.history]
        without_top, without_other = clf.predict(
            [Example.from_texts(drop_word(example.utterance, j), history) for j in (top, other)]
        )
        top_drops.append(prediction.score - without_top.score)
        random_drops.append(prediction.score - without_other.score)
        assert top_drops[-1] >= random_drops[-1] - 1e-6, (example.utterance, ex["utterance"][top]["word"])
    assert sum(top_drops) / len(top_drops) > sum(random_drops) / len(random_drops)
