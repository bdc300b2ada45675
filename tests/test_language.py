"""The language check (dialogue_safety/core/language.py): English is supported, a confident other
language is said, an uncertain short text is undetermined and claims no support, a non-Latin-script text is
never supported English, and the Python API and the HTTP service answer the same for the same text."""

from __future__ import annotations

from pathlib import Path

import pytest

from dialogue_safety.core import language


@pytest.mark.parametrize(
    ("text", "code", "supported"),
    [
        ("you are a clown and everyone laughs at you", "en", True),
        ("va te faire foutre espèce de con, tu ne comprends rien", "fr", False),
        ("Du bist ein Idiot und alle hassen dich", "de", False),
        ("sei proprio un idiota, nessuno ti sopporta più", "it", False),
        ("lol", language.UNDETERMINED, None),
        ("@USER ok", language.UNDETERMINED, None),
        ("Du bist so dumm", language.UNDETERMINED, None),  # short German: too short to tell, no claim
        ("Halt die Klappe, du Idiot", language.UNDETERMINED, None),
        ("你真是个蠢货", language.UNDETERMINED, False),  # a short Chinese insult: never supported English
        ("去死吧", language.UNDETERMINED, False),
        ("Ты идиот", language.UNDETERMINED, False),
        ("バカ", "ja", False),
        ("🙂👍", language.UNDETERMINED, None),
    ],
)
def test_detect(text: str, code: str, supported: bool | None) -> None:
    found = language.detect(text)
    assert (found.code, found.supported) == (code, supported), found
    assert 0.0 <= found.confidence <= 1.0


def test_only_the_first_characters_are_read() -> None:
    english = "this is an ordinary English sentence about the weather. " * 20
    assert len(english) > language.SAMPLE_CHARS
    assert language.detect(english + "ceci est une phrase en français " * 40).code == "en"


def test_the_runtime_says_the_language_when_asked() -> None:
    from pathlib import Path

    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.schema import Example

    model = Path(__file__).resolve().parents[1] / "models" / "default"
    examples = [Example(utterance="espèce de con, tu ne comprends rien"), Example(utterance="you are a clown, really")]
    checked = OnnxClassifier(model, variant="fp32", language_check=True).predict(examples)
    assert [(p.read.language, p.read.language_supported) for p in checked] == [("fr", False), ("en", True)]
    assert checked[0].reading()["language"] == "fr" and checked[0].reading()["language_supported"] is False
    unchecked = OnnxClassifier(model, variant="fp32").predict(examples)
    assert all(p.read.language is None and "language" not in p.reading() for p in unchecked)
    assert [p.score for p in unchecked] == pytest.approx([p.score for p in checked])  # the verdict is unchanged


def test_the_language_benchmark_runs(data_dir: object, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from lab.bench.cli import main as bench_main

    assert bench_main(["language", "--data-dir", str(data_dir), "--foreign", "40"]) == 0
    printed = capsys.readouterr().out
    report = json.loads(printed[: printed.index("\n\n###")])
    assert report["n"]["foreign"] == 40 and report["n"]["english"] > 1000
    in_force = next(r for r in report["not_english_by_confidence"] if r["in_force"])
    assert in_force["min_confidence"] == language.MIN_CONFIDENCE
    assert in_force["english_not_english"] < 0.05 < 0.5 < in_force["foreign_not_english"]


#: short texts of each kind: English, too short to tell, German, Chinese, Cyrillic
SAME_ANSWER = ["you are a clown and everyone laughs at you", "ok", "Du bist so dumm", "你真是个蠢货", "Ты идиот"]


def test_the_python_api_and_the_http_service_answer_the_same() -> None:
    """``dialogue_safety.load`` and ``dialogue-safety serve`` (defaults both) on the same model and texts."""
    from service_conftest import live_server

    import dialogue_safety

    model = Path(__file__).resolve().parents[1] / "models" / "default"
    python = [
        p.reading()
        for p in dialogue_safety.classify_batch(SAME_ANSWER, model=dialogue_safety.load(model, variant="fp32"))
    ]
    with live_server(model_dir=model, variant="fp32") as server, server.client() as client:
        http = [client.post("/v1/classify", json={"utterance": t}).json() for t in SAME_ANSWER]
    for text, mine, theirs in zip(SAME_ANSWER, python, http, strict=True):
        assert "language" in mine, "the Python API checks the language by default, as the service does"
        assert (mine["language"], mine["language_supported"]) == (theirs["language"], theirs["language_supported"]), (
            text
        )
    assert [(a["language"], a["language_supported"]) for a in http] == [
        ("en", True),
        ("und", None),
        ("und", None),
        ("und", False),
        ("und", False),
    ]
