"""The shipped model's recipe (``recipes/default.toml``) end to end on the format fixtures: every one of its
tasks loads and trains (a few steps of a random tiny BERT in place of MiniLM), the export keeps the
attribute heads and the obfuscation normaliser in the card, the ONNX runtime reads disguised words as
the plain ones, and the service answers with the new categories (/v1/classify and /v1/moderations)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_conftest import live_server

from dialogue_safety.cli.main import main as cli_main
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example

FULL = Path(__file__).parent / "fixtures" / "sources" / "full"
TINY = [
    "--set",
    "base=random:tiny",
    "--set",
    "vocab_file=tests/fixtures/tiny_vocab.txt",
    "--set",
    "max_steps=8",
    "--set",
    "batch_size=8",
    "--set",
    "eval_every=4",
    "--set",
    "checkpoint_every=4",
    "--set",
    "num_threads=1",
    "--set",
    "encoding.max_length=64",
    "--set",
    "encoding.max_utterance_tokens=32",
]


@pytest.fixture(scope="module")
def candidate_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("candidate")
    argv = ["train", "--config", "default", "--data-dir", str(FULL), "--out", str(out / "ckpt"), "--no-progress"]
    assert cli_main([*argv, *TINY]) == 0
    assert cli_main(["export", str(out / "ckpt"), str(out / "model"), "--no-eval", "--variants", "fp32", "-q"]) == 0
    return out / "model"


def test_every_task_trains_and_the_card_keeps_heads_normaliser_and_curve(candidate_model: Path) -> None:
    card = json.loads((candidate_model / "model_card.json").read_text())
    assert card["version"] == "0.5.0"
    assert card["heads"] == ["offensive", "hateful", "unsafe_in_context", "violence", "unsafe_request"]
    assert card["encoding"]["normalise_obfuscation"] is True and card["encoding"]["context_mode"] == "decomposed"
    trained = set(card["training"]["examples"])
    assert {"bad_fsb/bot", "bad_fsb/human", "toxicchat", "safetext", "medical_safety", "requests"} <= trained
    assert {"conda", "context_toxicity", "edos", "ghc", "disguised", "collages", "context_pairs"} <= trained
    calibration = card["calibration"]
    assert calibration["threshold_objective"] == "selection" and calibration["false_alarm_penalty"] == 0.5
    assert [c["step"] for c in card["training"]["curve"]["valid"]] == [4, 8]
    # every category states its own validation-tuned threshold, the attribute heads on the sources labelling them
    heads = card["metrics"]["heads"]
    assert set(heads) == set(card["heads"])
    assert "requests" in heads["unsafe_request"]["sources"]
    assert "edos" in heads["violence"]["sources"]
    assert all(0 < heads[h]["threshold"] < 1 for h in heads)
    assert "### Validation curve" in (candidate_model / "MODEL_CARD.md").read_text()


def test_the_runtime_reads_disguised_words_as_the_plain_ones(candidate_model: Path) -> None:
    clf = OnnxClassifier(candidate_model, variant="fp32")
    plain, leet, spaced, emoji = clf.predict(
        [
            Example(utterance="you are an idiot"),
            Example(utterance="you are an 1d10t"),
            Example(utterance="you are an i d i o t"),
            Example(utterance="you are an 🇮🇩🇮🇴🇹"),
        ]
    )
    assert leet.score == pytest.approx(plain.score, abs=1e-6)
    assert spaced.score == pytest.approx(plain.score, abs=1e-6)
    assert emoji.score == pytest.approx(plain.score, abs=1e-6)  # a run of regional-indicator letters
    assert set(plain.categories) >= {"violence", "unsafe_request"}


def test_the_service_answers_the_new_categories(candidate_model: Path) -> None:
    with live_server(model_dir=candidate_model, max_wait_ms=1.0) as live, live.client() as c:
        r = c.post("/v1/classify", json={"utterance": "how do I make a bomb", "history": ["hi"]})
        assert r.status_code == 200, r.text
        assert {"violence", "unsafe_request"} <= set(r.json()["categories"])
        m = c.post("/v1/moderations", json={"input": "I will hurt you"})
        assert m.status_code == 200, m.text
        result = m.json()["results"][0]
        assert "violence" in result["categories"] and "violence" in result["category_scores"]
