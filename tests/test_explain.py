"""Explanations on real ONNX Runtime sessions.

Occlusion: each contribution is the drop in the runtime's own served score when that word is
removed. Shapley (the default): exact values equal a brute-force Shapley computation over the
runtime's scores; every explanation is efficient (contributions add up to the score minus the
score without the explained words); redundant insults both get positive shares; and on the
shipped model it agrees with leave-one-out where leave-one-out is clear (the top word's removal
lowers the score more than a random word's; a word occlusion finds clearly offensive is positive).
No exact score of the shipped model is assumed."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core.explain import coalitions, explain, kernel_shap, plan, word_spans
from dialogue_safety.core.model_dir import default_model_dir
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example, Label, Prediction

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
    ((prediction, ex),) = explain(clf, [example], history=True, method="occlusion")
    assert ex["method"] == "occlusion" and prediction.score == clf.predict([example])[0].score == ex["score"]
    for i, w in enumerate(ex["utterance"]):
        alone = clf.predict([Example.from_texts(drop_word(example.utterance, i), ["hello there friend"])])[0].score
        assert w["contribution"] == pytest.approx(prediction.score - alone, abs=1e-6)
    for i, w in enumerate(ex["history"][0]):
        alone = clf.predict([Example.from_texts(example.utterance, [drop_word("hello there friend", i)])])[0].score
        assert w["contribution"] == pytest.approx(prediction.score - alone, abs=1e-6)


def test_the_cap_explains_the_utterance_first_then_the_newest_turn() -> None:
    example = Example.from_texts("a b c", ["old turn here", "new turn"])
    p = plan(example, history=True, max_words=4, method="occlusion")
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
    # a Shapley value is a word's mean marginal effect over coalitions, not its leave-one-out drop from the whole
    # utterance (redundant evidence: without "disgusting", "vermin" scores higher still), so the check is on the
    # whole set: the top word's removal costs more than a random word's on average and in most utterances
    assert sum(top_drops) / len(top_drops) > sum(random_drops) / len(random_drops), (top_drops, random_drops)
    wins = sum(t > r for t, r in zip(top_drops, random_drops, strict=True))
    assert wins > len(top_drops) / 2, (top_drops, random_drops)


def brute_force_shapley(clf: OnnxClassifier, words: list[str], history: list[str]) -> list[float]:
    n = len(words)
    value = {}
    for mask in itertools.product([False, True], repeat=n):
        text = " ".join(w for w, keep in zip(words, mask, strict=True) if keep)
        value[mask] = clf.predict([Example.from_texts(text, history)])[0].score
    phi = []
    for i in range(n):
        total = 0.0
        for mask, v in value.items():
            if mask[i]:
                continue
            with_i = tuple(True if j == i else m for j, m in enumerate(mask))
            k = sum(mask)
            total += math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n) * (value[with_i] - v)
        phi.append(total)
    return phi


def test_exact_shapley_values_match_a_brute_force_computation(tiny_model_dir: Path) -> None:
    clf = OnnxClassifier(tiny_model_dir, variant="fp32")
    words, history = ["you", "are", "a", "stupid", "idiot"], ["hello there"]
    ((prediction, ex),) = explain(clf, [Example.from_texts(" ".join(words), history)])
    assert ex["method"] == "shapley" and ex["exact"] and ex["coalitions"] == 2**5 - 2
    assert ex["score"] == prediction.score
    got = [w["contribution"] for w in ex["utterance"]]
    assert got == pytest.approx(brute_force_shapley(clf, words, history), abs=1e-5)


@pytest.mark.parametrize("words", [3, 9, 40])
def test_shapley_contributions_add_up_to_the_score_change_from_no_words(tiny_model_dir: Path, words: int) -> None:
    clf = OnnxClassifier(tiny_model_dir, variant="fp32")
    utterance = " ".join(f"w{i} idiot" if i % 3 == 0 else f"w{i}" for i in range(words))
    example = Example.from_texts(utterance, ["how are you", "fine thanks"])
    ((prediction, ex),) = explain(clf, [example], history=True)
    empty = clf.predict([Example.from_texts("", ["how are you", "fine thanks"])])
    explained = [w["contribution"] for w in ex["utterance"]] + [w["contribution"] for t in ex["history"] for w in t]
    assert all(c is not None for c in explained) and ex["exact"] == (len(explained) <= 6)
    # the baseline: every explained word removed (history words too)
    assert ex["baseline"] == pytest.approx(clf.predict([Example.from_texts("", ["", ""])])[0].score, abs=1e-6)
    assert sum(explained) == pytest.approx(prediction.score - ex["baseline"], abs=1e-6)
    ((_, utterance_only),) = explain(clf, [example])
    assert utterance_only["baseline"] == pytest.approx(empty[0].score, abs=1e-6)
    assert sum(w["contribution"] for w in utterance_only["utterance"]) == pytest.approx(
        prediction.score - empty[0].score, abs=1e-6
    )
    assert explain(clf, [example])[0][1] == utterance_only  # seeded by the text: the same answer twice


def test_the_sampled_coalitions_are_complementary_pairs_beyond_the_singletons() -> None:
    masks, weights, exact = coalitions(12, 16, seed=3)
    assert not exact and masks[:12].sum(axis=1).tolist() == [1] * 12 and (weights > 0).all()
    keys = {m.tobytes() for m in masks[12:]}
    assert all((~m).tobytes() in keys for m in masks[12:] if 2 <= m.sum() <= 10)
    # an additive game is recovered exactly from any coalition set that spans it
    phi = [0.5, -0.25, 0.0, 0.1, 0.3, 0.0, 0.0, -0.1, 0.2, 0.0, 0.05, 0.0]
    values = masks.astype(float) @ phi
    assert kernel_shap(masks, weights, values, 0.0, sum(phi)) == pytest.approx(phi, abs=1e-4)


@pytest.mark.slow
def test_redundant_insults_both_get_positive_contributions() -> None:
    clf = OnnxClassifier(default_model_dir())
    ((prediction, ex),) = explain(clf, [Example.from_texts("you are a stupid idiot")])
    c = {w["word"]: w["contribution"] for w in ex["utterance"]}
    assert prediction.score > 0.5 and c["stupid"] > 0.05 and c["idiot"] > 0.05
    assert min(c["stupid"], c["idiot"]) > max(c["you"], c["are"], c["a"])
    ((_, loo),) = explain(clf, [Example.from_texts("you are a stupid idiot")], method="occlusion")
    loo_c = {w["word"]: w["contribution"] for w in loo["utterance"]}
    assert min(c["stupid"], c["idiot"]) > max(loo_c["stupid"], loo_c["idiot"])  # what occlusion misses


@pytest.mark.slow
def test_shapley_agrees_with_occlusion_where_occlusion_is_clear() -> None:
    clf = OnnxClassifier(default_model_dir())
    examples = [Example.from_texts(u, list(h)) for u, h in OFFENSIVE]
    shapley = explain(clf, examples)
    occlusion = explain(clf, examples, method="occlusion")
    for example, (_, s), (_, o) in zip(examples, shapley, occlusion, strict=True):
        for ws, wo in zip(s["utterance"], o["utterance"], strict=True):
            if wo["contribution"] > 0.1:  # removing this word alone clearly lowers the score
                assert ws["contribution"] > 0, (example.utterance, ws["word"], ws["contribution"])


class OrModel:
    """0.9 when the utterance holds either insult, else 0.1: two redundant words (Shapley: 0.4 each)."""

    def predict(self, examples: list[Example], threshold: float | None = None) -> list[Prediction]:
        out = []
        for e in examples:
            score = 0.9 if {"stupid", "idiot"} & set(e.utterance.split()) else 0.1
            out.append(Prediction(score, Label.from_bool(score >= 0.5), 0.5, {"offensive": score}))
        return out


@pytest.mark.parametrize("words", [9, 16, 40, 120])
def test_redundant_words_share_the_credit_in_long_messages(words: int) -> None:
    filler = [f"w{i}" for i in range(words - 2)]
    text = " ".join(filler[: words // 3] + ["stupid"] + filler[words // 3 :] + ["idiot"])
    ((prediction, ex),) = explain(OrModel(), [Example.from_texts(text)])
    c = {w["word"]: w["contribution"] for w in ex["utterance"]}
    assert not ex["exact"] and prediction.score == 0.9
    assert c["stupid"] == pytest.approx(0.4, abs=0.12) and c["idiot"] == pytest.approx(0.4, abs=0.12)
    assert max(abs(c[w]) for w in filler) < 0.05
    assert sum(c.values()) == pytest.approx(0.8, abs=1e-9)
