"""End-to-end ``evaluate`` on the fixture data dir with a fake scorer; scorers and baseline plumbing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_eval_support import FIXTURE_DATA, KeywordScorer, ex, read_fixture_source

from dialogue_safety.core.schema import Example, Split
from dialogue_safety.evaluation import evaluate
from dialogue_safety.evaluation.baseline import TfidfBaseline, baseline_text
from dialogue_safety.evaluation.evaluate import EvaluationConfig, run_evaluation, subsample
from dialogue_safety.evaluation.scorers import CachedScorer, ClassifierScorer, card_training_sources, model_kind

CONFIG = EvaluationConfig(
    sources=("dialog", "hate", "absent"),
    functional=("suite",),
    baseline_sources=("dialog", "hate"),
    progress=False,
)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("report")
    scorer = KeywordScorer(["idiot", "stupid", "hate", "vermin", "rats"], use_history=True)
    results = run_evaluation(scorer, FIXTURE_DATA, out, CONFIG, loader=read_fixture_source)
    return out, results


def test_end_to_end_writes_report_results_and_plots(report_dir: tuple[Path, dict]) -> None:
    out, results = report_dir
    for name in ("report.md", "results.json", "functional_suite.png", "groups_suite.png", "calibration.png", "aaa.png"):
        assert (out / name).is_file(), name
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC
    on_disk = json.loads((out / "results.json").read_text(encoding="utf-8"), parse_constant=pytest.fail)
    assert on_disk == results  # strict JSON (no NaN), same numbers as returned
    assert (out / "results.json").stat().st_size < 300_000
    assert results["roles"] == ["model", "baseline", "peer"]  # alt-profanity-check comes with the train extra
    assert results["peer"] == {"name": "alt-profanity-check", "threshold": 0.5}
    flips = results["context_flips"]["scorers"]
    assert flips["model"]["overall"]["pairs"] >= 100
    # the peer reads the utterance only: it can never get both sides of a pair right
    assert flips["peer"]["overall"]["both_right"] == 0
    assert "## 5. Context flips" in (out / "report.md").read_text(encoding="utf-8")
    assert set(results["skipped"]) == {"absent"}
    assert "FileNotFoundError" in results["skipped"]["absent"]
    # the history measures on the fixture test splits (the keyword scorer reads the history too)
    history = results["history"]["scorers"]["model"]
    assert history["benign_history"]["worst_drop"] == 0.0
    assert history["hostile_history"]["pooled"] == {"alone": 0.0, "after": 100.0}  # "rats" in every hostile turn
    assert history["counter_speech"]["endorsements"] == {"n": 1, "caught": 100.0}
    assert "## 6. How the history moves the verdict" in (out / "report.md").read_text(encoding="utf-8")
    assert results["baseline"]["sources"] == ["dialog", "hate"]
    assert results["baseline"]["n_train"] == 16


def test_end_to_end_numbers(report_dir: tuple[Path, dict]) -> None:
    _, results = report_dir
    rows = {(r["task"], r["round"], r["split"]): r for r in results["rounds"]["rows"]}
    # hate test, round 2 (2a + 2b): model flags "I hate that group", "I hate that song", "that group are rats"
    r2 = rows[("hate", "2", "test")]
    assert r2["combines"] == ["2a", "2b"]
    assert r2["metrics"]["model"]["accuracy"] == pytest.approx(75.0)
    assert r2["perturbation"]["model"]["original"]["accuracy"] == pytest.approx(100.0)
    assert r2["perturbation"]["model"]["perturbation"]["accuracy"] == pytest.approx(50.0)
    assert r2["model_in_the_loop"] == {"n": 4, "error_rate": pytest.approx(75.0)}
    suite = results["functional"]["suite"]["scorers"]["model"]
    assert suite["overall"]["accuracy"] == pytest.approx(50.0)
    assert suite["flagged"] == ["counter_quote_nh"]
    assert set(results["aaa"]["sources"]) == {"dialog", "hate"}
    assert results["aaa"]["sources"]["dialog"]["templates"]["used"] == 2
    ctx = {(r["source"], r["split"]): r for r in results["context"]["rows"]}
    assert set(ctx) == {("dialog", "valid"), ("dialog", "test")}
    # dialog test: only "agreed" (history "they are all stupid") depends on the history
    assert ctx[("dialog", "test")]["scorers"]["model"]["difference"]["recall"] == pytest.approx(50.0)


def test_end_to_end_report_sections(report_dir: tuple[Path, dict]) -> None:
    out, _ = report_dir
    report = (out / "report.md").read_text(encoding="utf-8")
    for heading in (
        "## 1. Held-out and adversarial rounds",
        "BBF Table 6 layout",
        "DynaHate Table 4 layout",
        "### Original vs perturbation accuracy",
        "### Model-in-the-loop error rate per round",
        "## 2. Functional suites",
        "## 3. AAA",
        "## 4. Context sensitivity",
        "## Anchors from the papers",
        "![AAA breakdown](aaa.png)",
    ):
        assert heading in report, heading
    assert "⚠ `counter_quote_nh`" in report
    assert " / " in report  # model / baseline cells


def test_cli_main_with_fake_scorer_and_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate, "registry_loader", read_fixture_source)
    monkeypatch.setattr(evaluate, "load_scorer", lambda path: KeywordScorer(["idiot", "hate"]))
    monkeypatch.setattr(evaluate, "model_kind", lambda path: "fake")
    monkeypatch.setattr(evaluate, "card_training_sources", lambda path: ["dialog"])
    out = tmp_path / "cli"
    argv = ["somemodel", "--data-dir", str(FIXTURE_DATA), "--out", str(out), "--suite", "rounds,context,baseline"]
    argv += ["--sources", "dialog,hate", "--limit", "3", "--no-progress"]
    assert evaluate.main(argv, prog="dialogue-safety evaluate") == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["baseline"]["sources"] == ["dialog"]  # from the (fake) model card
    assert all(r["n"] <= 3 for r in results["rounds"]["rows"] if r["round"] != "all")
    assert "functional" not in results and "aaa" not in results
    assert (out / "calibration.png").is_file() and not (out / "aaa.png").exists()


def test_cli_compare_adds_the_previous_model_to_every_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate, "registry_loader", read_fixture_source)
    scorers = {"new": KeywordScorer(["idiot", "hate"]), "old": KeywordScorer(["idiot"], use_history=True)}
    monkeypatch.setattr(evaluate, "load_scorer", lambda path: scorers[path])
    monkeypatch.setattr(evaluate, "model_kind", lambda path: "fake")
    monkeypatch.setattr(evaluate, "card_training_sources", lambda path: ["dialog"])
    out = tmp_path / "cli"
    argv = ["new", "--compare", "old", "--data-dir", str(FIXTURE_DATA), "--out", str(out)]
    argv += ["--suite", "rounds,context_flips,history", "--sources", "dialog,hate", "--no-progress"]
    assert evaluate.main(argv, prog="dialogue-safety evaluate") == 0
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["roles"] == ["model", "previous"] and results["previous"]["path"] == "old"
    assert set(results["context_flips"]["scorers"]) == set(results["history"]["scorers"]) == {"model", "previous"}
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "- previous: `old`" in report and "## 6. How the history moves the verdict" in report


def test_cli_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = evaluate.main([str(tmp_path / "nope"), "--data-dir", str(FIXTURE_DATA)], prog="evaluate")
    assert code == 2
    assert "model directory does not exist" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown suites"):
        EvaluationConfig(suites=("rounds", "speed"))


def test_model_kind_detection(tmp_path: Path) -> None:
    onnx = tmp_path / "exported"
    onnx.mkdir()
    (onnx / "model.onnx").write_bytes(b"")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"")
    assert model_kind(onnx) == "onnx" and model_kind(ckpt) == "checkpoint"
    with pytest.raises(ValueError, match="neither an exported model directory"):
        model_kind(tmp_path)


def test_card_training_sources(tmp_path: Path) -> None:
    (tmp_path / "model_card.json").write_text(json.dumps({"training": {"sources": ["convabuse", "hatemoji"]}}))
    assert card_training_sources(tmp_path) == ["convabuse", "hatemoji"]
    (tmp_path / "model_card.json").write_text(json.dumps({"training": {}}))
    assert card_training_sources(tmp_path) is None
    assert card_training_sources(tmp_path / "missing") is None


def test_cached_scorer_batches_and_remembers() -> None:
    inner = KeywordScorer(["bad"])
    cached = CachedScorer(inner, batch_size=2, progress=False)
    examples = [Example.from_texts(t) for t in ("bad", "ok", "bad", "fine", "x")]
    assert cached.predict_proba(examples).tolist() == [0.9, 0.1, 0.9, 0.1, 0.1]
    assert inner.calls == [2, 2]  # 4 distinct examples in batches of 2
    cached.predict_proba(examples[:2])
    assert inner.calls == [2, 2]  # nothing new to score
    assert cached.name == "keywords" and cached.threshold == 0.5


def test_classifier_scorer_adapts_a_runtime_like_object() -> None:
    class Card:
        model_id = "toy@1"
        threshold = 0.3

    class Runtime:
        card = Card()

        def predict_proba(self, examples: list[Example]) -> np.ndarray:
            return np.full((len(examples), 1), 0.4)

    scorer = ClassifierScorer(Runtime())
    assert (scorer.name, scorer.threshold) == ("toy@1", 0.3)
    assert scorer.predict_proba([Example.from_texts("a"), Example.from_texts("b")]).tolist() == [0.4, 0.4]


def test_baseline_input_and_threshold() -> None:
    assert baseline_text(Example.from_texts("you idiot", ["hi", "hello"])) == "hi hello [SEP] you idiot"
    assert baseline_text(Example.from_texts("alone")) == " [SEP] alone"
    examples = read_fixture_source("dialog", FIXTURE_DATA)
    train = [e for e in examples if e.split is Split.TRAIN]
    valid = [e for e in examples if e.split is Split.VALID]
    model = TfidfBaseline.fit(train, valid)
    assert model.info["n_train"] == 8 and model.info["valid_offensive_f1"] is not None
    probs = model.predict_proba([ex("you stupid idiot", True), ex("lovely sunny day", False)])
    assert probs[0] > probs[1]
    with pytest.raises(ValueError, match="both classes"):
        TfidfBaseline.fit([e for e in train if e.label.is_positive])


def test_subsample_is_seeded_and_keeps_order() -> None:
    items = [ex(str(i), i % 2 == 0) for i in range(10)]
    a, b = subsample(items, 4, seed=1), subsample(items, 4, seed=1)
    assert [e.utterance for e in a] == [e.utterance for e in b]
    assert [int(e.utterance) for e in a] == sorted(int(e.utterance) for e in a)
    assert subsample(items, None, 0) == items


@pytest.mark.slow
def test_load_scorer_on_a_training_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """The torch path end to end: a (random) tiny checkpoint evaluated on the fixture data."""
    from dialogue_safety.evaluation.scorers import load_scorer

    scorer = load_scorer(tiny_checkpoint)
    assert scorer.threshold == 0.5
    config = EvaluationConfig(suites=("rounds", "context"), sources=("dialog",), progress=False)
    results = run_evaluation(scorer, FIXTURE_DATA, tmp_path, config, loader=read_fixture_source)
    probs = [b["mean_prob"] for b in results["rounds"]["calibration"]["model"]["bins"] if b["count"]]
    assert probs and all(0.0 <= p <= 1.0 for p in probs)
    assert (tmp_path / "report.md").is_file()
