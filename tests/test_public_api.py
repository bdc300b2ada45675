"""The package's one-liner: ``dialogue_safety.classify(utterance, history)`` on the bundled model (models/default)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dialogue_safety
from dialogue_safety import Example, Label, Prediction, Turn, classify, classify_batch, load
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.runtime import ModelLoadError, OnnxClassifier

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "models" / "default"
CONTEXT = ["what do you think of my neighbours?", "I don't know them. What are they like?"]


@pytest.fixture(scope="module")
def bundled() -> OnnxClassifier:
    return load()


def test_the_public_names() -> None:
    assert sorted(dialogue_safety.__all__) == [
        "Client",
        "Example",
        "Label",
        "Policy",
        "PolicyError",
        "Prediction",
        "Turn",
        "classify",
        "classify_batch",
        "classify_conversation",
        "classify_messages",
        "load",
        "load_policy",
    ]
    assert all(hasattr(dialogue_safety, name) for name in dialogue_safety.__all__)


def test_dir_lists_the_public_names_and_not_the_helpers_the_package_imports() -> None:
    assert dir(dialogue_safety) == sorted(dialogue_safety.__all__)
    helpers = {"Any", "functools", "TYPE_CHECKING", "annotations", "Path", "parse_messages"}
    assert not helpers & set(dir(dialogue_safety))
    namespace: dict[str, object] = {}
    exec("from dialogue_safety import *", namespace)  # noqa: S102  (what a star import brings: __all__, every name real)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(dialogue_safety.__all__)


def test_importing_the_package_loads_no_model_no_torch_and_no_web_framework() -> None:
    code = (
        "import json, sys, dialogue_safety\n"
        "heavy = ('torch', 'transformers', 'fastapi', 'starlette', 'uvicorn', 'onnxruntime', 'tokenizers')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []


def test_load_defaults_to_the_bundled_model(bundled: OnnxClassifier) -> None:
    assert isinstance(bundled, OnnxClassifier)
    assert bundled.model_dir == BUNDLED
    assert bundled.model_id == ModelCard.load(BUNDLED).model_id
    assert load(BUNDLED, variant="fp32").variant == "fp32"


def test_load_names_a_directory_that_is_no_model(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no model directory"):
        load(tmp_path / "nowhere")


def test_classify_one_dialogue(bundled: OnnxClassifier) -> None:
    prediction = classify("they should all be thrown out of the country", CONTEXT, bundled)
    assert isinstance(prediction, Prediction)
    assert 0.0 <= prediction.score <= 1.0
    assert prediction.label is Label.from_bool(prediction.score >= prediction.threshold)
    assert prediction.threshold == bundled.card.threshold  # the card's decision unless told otherwise
    same = bundled.predict(
        [Example(utterance="they should all be thrown out of the country", history=tuple(Turn(t) for t in CONTEXT))]
    )[0]
    assert prediction == same
    assert classify("you are an idiot").label is Label.OFFENSIVE  # the bundled model, loaded on first use
    assert classify("thanks, that helps a lot", ["can you recommend a book?"]).label is Label.SAFE


def test_history_turns_may_name_their_speakers(bundled: OnnxClassifier) -> None:
    turns = (Turn(CONTEXT[0], "user"), Turn(CONTEXT[1], "bot"))  # passed on as they are (the card decides their use)
    assert classify("so what", turns, bundled) == bundled.predict([Example(utterance="so what", history=turns)])[0]


def test_classify_a_batch_in_order(bundled: OnnxClassifier) -> None:
    items: list[Example | str] = [
        "you are an idiot",
        Example.from_texts("they should all be thrown out of the country", CONTEXT),
        "have a nice day",
    ]
    batch = classify_batch(items, bundled)
    singles = [
        classify("you are an idiot", model=bundled),
        classify("they should all be thrown out of the country", CONTEXT, bundled),
        classify("have a nice day", model=bundled),
    ]
    assert [p.label for p in batch] == [p.label for p in singles]
    assert [p.score for p in batch] == pytest.approx([p.score for p in singles], abs=1e-5)
    assert classify_batch([], bundled) == []


def test_a_threshold_decides_the_label(bundled: OnnxClassifier) -> None:
    always = classify("have a nice day", model=bundled, threshold=0.0)
    never = classify("you are an idiot", model=bundled, threshold=1.0)
    assert (always.label, always.threshold) == (Label.OFFENSIVE, 0.0)
    assert (never.label, never.threshold) == (Label.SAFE, 1.0)
    assert [p.label for p in classify_batch(["a", "b"], bundled, threshold=0.0)] == [Label.OFFENSIVE] * 2


def test_arguments_are_checked_as_the_service_checks_a_request(bundled: OnnxClassifier) -> None:
    from dialogue_safety.core.errors import InvalidInput

    for bad in (1.5, -0.1, float("nan"), True, "0.5"):
        with pytest.raises(InvalidInput, match="threshold must be a number in") as caught:
            classify("you idiot", model=bundled, threshold=bad)  # type: ignore[arg-type]
        assert caught.value.code == "invalid_threshold"
    with pytest.raises(TypeError, match="utterance must be a string"):
        classify(None, model=bundled)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="history is a list of turns"):
        classify("so what", "I lost my job today", bundled)  # type: ignore[arg-type]
    as_dicts = classify("so what", [{"text": "I lost my job today", "speaker": "user"}], bundled)
    as_turns = classify("so what", [Turn("I lost my job today", "user")], bundled)
    assert as_dicts.score == as_turns.score  # the history as the client sends it


def test_threads_that_classify_at_start_load_the_bundled_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    loads: list[int] = []

    def slow_load(*args: object, **kwargs: object) -> object:
        loads.append(1)
        time.sleep(0.2)
        return object()

    monkeypatch.setattr(dialogue_safety, "load", slow_load)
    monkeypatch.setattr(dialogue_safety, "_BUNDLED", [])
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(dialogue_safety._bundled())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(got) == 4 and all(g is got[0] for g in got)
