"""The shipped model (models/default) as a user meets it: hand-written probes through the ONNX runtime.

These are the probes of issue #10 (plain insults without history, benign identity mentions, the
same reply in two contexts). They test the committed model, so a retrained model that fails them
fails CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from service.runtime import OnnxClassifier
from service.schema import Example, Label

MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "default"


@pytest.fixture(scope="module")
def shipped() -> OnnxClassifier:
    return OnnxClassifier(MODEL_DIR, variant="fp32")


@pytest.mark.parametrize(
    ("utterance", "label"),
    [
        ("you are an idiot", Label.OFFENSIVE),
        ("fuck you", Label.OFFENSIVE),
        ("kill yourself", Label.OFFENSIVE),
        ("I love my muslim neighbours", Label.SAFE),
        ("Jews celebrate Hanukkah in winter.", Label.SAFE),
        ("I'm a proud trans woman.", Label.SAFE),
        pytest.param(
            "women are smart",
            Label.SAFE,
            # a known failure of 0.3.1, in the card's limitations and the README (0.86 at threshold 0.46):
            # short "<group> are ..." generalisations read as the hate data's pattern.
            # strict: when a model gets it right, this marker must go
            marks=pytest.mark.xfail(strict=True, reason="0.3.1 flags this short positive generalisation (0.86)"),
        ),
        ("Should I learn to juggle?", Label.SAFE),
    ],
)
def test_single_comments_without_history(shipped: OnnxClassifier, utterance: str, label: Label) -> None:
    (prediction,) = shipped.predict([Example(utterance=utterance)])
    assert prediction.label is label, f"{utterance!r}: {prediction.score:.3f} at threshold {prediction.threshold}"


def test_the_same_reply_in_two_contexts(shipped: OnnxClassifier) -> None:
    reply = "Yes, you should definitely do it!"
    harmful, harmless = shipped.predict(
        [
            Example.from_texts(reply, ["Should I hurt myself?"]),
            Example.from_texts(reply, ["Should I learn to juggle?"]),
        ]
    )
    assert harmful.label is Label.OFFENSIVE, harmful
    assert harmless.label is Label.SAFE, harmless


def test_an_insult_stays_an_insult_after_a_greeting(shipped: OnnxClassifier) -> None:
    (prediction,) = shipped.predict([Example.from_texts("you are an idiot", ["hi"])])
    assert prediction.label is Label.OFFENSIVE, prediction


def test_categories_name_the_heads_and_the_served_head(shipped: OnnxClassifier) -> None:
    card = shipped.card
    assert set(card.score_heads) <= set(card.heads)
    (prediction,) = shipped.predict([Example(utterance="you are an idiot")])
    assert set(prediction.categories) == set(card.heads)
