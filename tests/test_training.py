"""The training path end to end on the format fixtures (the BBF paper's tasks), in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_fp32_parity
from safetensors.torch import load_file

from dialogue_safety.core.schema import Example
from dialogue_safety.training.checkpoint import load_checkpoint
from dialogue_safety.training.inference import TorchClassifier
from dialogue_safety.training.recipe import load_recipe
from dialogue_safety.training.run_dir import LAST_DIR, METRICS_FILE
from dialogue_safety.training.tasks import DataError
from dialogue_safety.training.trainer import train

FULL = Path(__file__).parent / "fixtures" / "sources" / "full"
PAPER_TASKS = {"wtc", "bbf_single_turn/standard", "bbf_single_turn/adversarial", "bbf_multi_turn"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    recipe = load_recipe("tiny")
    out = tmp_path_factory.mktemp("tiny_run")
    train(recipe, FULL, out, progress=False)
    return out


def test_tiny_recipe_trains_evaluates_and_calibrates(tiny_run: Path) -> None:
    card = json.loads((tiny_run / "model_card.json").read_text())
    assert set(card["training"]["examples"]) >= PAPER_TASKS
    assert 0.0 < card["threshold"] < 1.0
    assert card["heads"] == ["offensive"]
    for task in PAPER_TASKS - {"wtc"}:
        assert "offensive_f1" in card["metrics"]["test"][task]["all"]
    # BBF single-turn keeps its rounds: per-round rows exist
    assert set(card["metrics"]["test"]["bbf_single_turn/standard"]["rounds"]) == {"3"}
    assert set(card["metrics"]["valid"]["bbf_single_turn/standard"]["rounds"]) == {"1"}
    assert set(card["calibration"]) >= {"ece_before", "ece_after", "valid_offensive_f1_at_threshold"}
    assert "temperatures" not in card["calibration"] and "threshold" not in card["calibration"]  # once, at the top
    assert set(card["temperatures"]) == set(card["heads"]) and 0 < card["threshold"] < 1
    events = [json.loads(line)["event"] for line in (tiny_run / METRICS_FILE).read_text().splitlines()]
    assert events[0] == "start" and "train" in events and events[-1] == "done"
    assert not (tiny_run / LAST_DIR).exists()  # the resumable state is removed once finished


def test_checkpoint_predicts_like_the_service_contract(tiny_run: Path) -> None:
    clf = TorchClassifier(tiny_run)
    examples = [Example.from_texts("you are stupid", ["hi"]), Example(utterance="hello")]
    preds = clf.predict(examples)
    assert len(preds) == 2
    assert all(0.0 <= p.score <= 1.0 and p.threshold == clf.threshold for p in preds)
    assert np.allclose(clf.predict_proba(examples), [p.score for p in preds])
    # batch equals single
    assert np.allclose([clf.predict([e])[0].score for e in examples], [p.score for p in preds], atol=1e-6)


@pytest.mark.parametrize("average_decay", [0.0, 0.5])
def test_resume_reproduces_an_uninterrupted_run(tmp_path: Path, average_decay: float) -> None:
    recipe = load_recipe(
        "tiny", ["max_steps=6", "checkpoint_every=100", "calibrate=false", f"average_decay={average_decay}"]
    )
    straight = tmp_path / "straight"
    train(recipe, FULL, straight, progress=False)
    resumed = tmp_path / "resumed"
    partial = train(recipe, FULL, resumed, progress=False, stop_after_steps=3)
    assert partial.steps == 3 and (resumed / LAST_DIR / "training_state.pt").is_file()
    done = train(recipe, FULL, resumed, resume=True, progress=False)
    assert done.steps == 6
    a = load_file(straight / "model.safetensors")
    b = load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6)
    if average_decay:  # the saved model is the average, not the last step's weights
        plain = train(load_recipe("tiny", ["max_steps=6", "calibrate=false"]), FULL, tmp_path / "plain", progress=False)
        c = load_file(plain.out_dir / "model.safetensors")
        assert not torch.equal(a["classifier.weight"], c["classifier.weight"])


@pytest.mark.parametrize("average_decay", [0.0, 0.5])
def test_periodic_validation_keeps_the_best_weights(tmp_path: Path, average_decay: float) -> None:
    recipe = load_recipe(
        "tiny", ["max_steps=6", "eval_every=2", "keep_best=true", "calibrate=false", f"average_decay={average_decay}"]
    )
    out = tmp_path / "best"
    result = train(recipe, FULL, out, progress=False)
    records = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    checks = [r for r in records if r["event"] == "valid"]
    assert [r["step"] for r in checks] == [2, 4, 6]
    for r in checks:
        # every source with validation rows is scored: F1 where it has positives, else how many it flags
        scored = set(r["offensive_f1"]) | set(r.get("flagged_rate", {}))
        assert scored == {name for name, n in result.card.training["examples"].items() if n["valid"]}
        assert r["macro_f1"] == pytest.approx(np.mean(list(r["offensive_f1"].values())))
    best = max(checks, key=lambda r: r["macro_f1"])  # the first of equal maxima wins
    assert result.card.training["selected_step"] == best["step"]
    assert checks[-1]["best_step"] == best["step"]
    restored = [r for r in records if r["event"] == "restored_best"]
    assert bool(restored) == (best["step"] != 6)
    assert not (out / "best_model.pt").exists()
    # the saved weights are the selected step's: their valid check reproduces its macro F1
    from dialogue_safety.training.validation import validation_check

    clf = TorchClassifier(out)
    from dialogue_safety.training.heads import head_names
    from dialogue_safety.training.tasks import load_task_data

    tasks, _ = load_task_data(recipe, FULL)
    again = validation_check(clf.model, clf.encoder, tasks, recipe, head_names(recipe, tasks))
    assert again["macro_f1"] == pytest.approx(best["macro_f1"], abs=1e-6)
    with pytest.raises(ValueError, match="keep_best needs eval_every"):
        load_recipe("tiny", ["keep_best=true"])


def test_the_weight_average_is_a_running_mean_then_exponential() -> None:
    from dialogue_safety.training.weight_average import WeightAverage

    model = torch.nn.Linear(2, 1)
    model.bias.requires_grad_(False)  # frozen weights are copied once and never averaged
    average = WeightAverage(model, decay=0.5)
    # 1 / (1 - decay) = 2 updates of a plain running mean (1, then 2), then halfway each time (3.5, then 6.25)
    for value, expected in [(1.0, 1.0), (3.0, 2.0), (5.0, 3.5), (9.0, 6.25)]:
        with torch.no_grad():
            model.weight.fill_(value)
        average.update()
        assert torch.allclose(average.model.weight, torch.full((1, 2), expected))
    assert torch.equal(average.model.bias, model.bias) and average.updates == 4
    copy = WeightAverage(model, decay=0.5)
    copy.restore(average.state())
    model.weight.data.fill_(0.0)
    average.update()
    copy.update()
    assert torch.equal(copy.model.weight, average.model.weight)
    with pytest.raises(ValueError, match="average_decay"):
        load_recipe("tiny", ["average_decay=1"])


def test_keep_best_can_weigh_false_alarms_on_safe_only_sets() -> None:
    from dialogue_safety.training.validation import score_valid_sets, selection_score

    gold = np.array([1, 1, 0, 0])
    sets = {
        "hate": (gold, np.array([0.9, 0.8, 0.1, 0.2])),
        "identity": (np.zeros(4, dtype=int), np.array([0.9, 0.1, 0.1, 0.1])),  # SAFE only: one of 4 flagged
    }
    check = score_valid_sets(sets)
    assert check["offensive_f1"] == {"hate": pytest.approx(100.0)}
    assert check["flagged_rate"] == {"identity": pytest.approx(0.25)}
    assert selection_score(check, 0.0) == pytest.approx(100.0)  # the macro F1 alone cannot see the false alarm
    assert selection_score(check, 0.5) == pytest.approx(100.0 - 0.5 * 25)
    assert selection_score(score_valid_sets({"hate": sets["hate"]}), 2.0) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="false_alarm_penalty"):
        load_recipe("tiny", ["false_alarm_penalty=-1"])


def test_continued_training_starts_from_a_checkpoint(tmp_path: Path) -> None:
    from dialogue_safety.training.heads import head_names
    from dialogue_safety.training.tasks import load_task_data
    from dialogue_safety.training.validation import validation_check

    first = load_recipe("tiny", ["max_steps=4", "calibrate=false"])
    train(first, FULL, tmp_path / "a", progress=False)
    start = TorchClassifier(tmp_path / "a")
    tasks, _ = load_task_data(first, FULL)
    before = validation_check(start.model, start.encoder, tasks, first, head_names(first, tasks))

    more = load_recipe("tiny", [f"init_from={tmp_path / 'a'}", "max_steps=2", "eval_every=2", "keep_best=true"])
    train(more, FULL, tmp_path / "b", progress=False, stop_after_steps=None)
    records = [json.loads(line) for line in (tmp_path / "b" / METRICS_FILE).read_text().splitlines()]
    checks = [r for r in records if r["event"] == "valid"]
    # step 0 is the checkpoint's own weights: the same validation score as scored directly
    assert [r["step"] for r in checks] == [0, 2]
    assert checks[0]["macro_f1"] == pytest.approx(before["macro_f1"], abs=1e-6)
    with pytest.raises(ValueError, match="not a training checkpoint"):
        train(load_recipe("tiny", [f"init_from={tmp_path}"]), FULL, tmp_path / "c", progress=False)
    other_heads = load_recipe("tiny", [f"init_from={tmp_path / 'a'}", "heads=harmonised"])
    with pytest.raises(ValueError, match="has heads"):
        train(other_heads, FULL, tmp_path / "d", progress=False)


def test_overrides_and_recipe_errors() -> None:
    r = load_recipe("tiny", ["epochs=1", "encoding.max_length=48", "tasks.wtc.weight=3"])
    assert r.epochs == 1 and r.encoding.max_length == 48
    assert next(t for t in r.tasks if t.source == "wtc").weight == 3
    with pytest.raises(ValueError, match="unknown recipe keys"):
        load_recipe("tiny", ["epochz=1"])
    with pytest.raises(ValueError, match="no task named"):
        load_recipe("tiny", ["tasks.nope.weight=1"])
    with pytest.raises(FileNotFoundError, match="no recipe"):
        load_recipe("does-not-exist")


def test_never_trains_on_hatecheck_and_requires_real_data(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="evaluation-only"):
        train(load_recipe("tiny", ['tasks=[{"source": "hatecheck"}]']), FULL, tmp_path / "a", progress=False)
    samples = Path(__file__).parent / "fixtures" / "sources" / "samples"
    with pytest.raises(DataError, match="only samples are present"):
        train(load_recipe("tiny", ['tasks=[{"source": "bbf_multi_turn"}]']), samples, tmp_path / "b", progress=False)


@pytest.mark.parametrize("name", ["default", "bert-base", "tiny"])
def test_shipped_recipes_parse(name: str) -> None:
    recipe = load_recipe(name)
    assert recipe.tasks
    assert all(t.source != "hatecheck" for t in recipe.tasks)


def test_soup_averages_weights_and_calibrates(tmp_path: Path) -> None:
    from lab.experiments.soup import SoupError, average_state_dicts, main, make_soup

    a, b = tmp_path / "a", tmp_path / "b"
    train(load_recipe("tiny", ["max_steps=3", "seed=1"]), FULL, a, progress=False)
    train(load_recipe("tiny", ["max_steps=3", "seed=2"]), FULL, b, progress=False)
    soup = tmp_path / "soup"
    assert main([str(a), str(b), "--out", str(soup), "--data-dir", str(FULL), "-q"]) == 0
    wa, wb, ws = (load_file(d / "model.safetensors") for d in (a, b, soup))
    for key in ("bert.encoder.layer.0.attention.self.query.weight", "classifier.weight"):
        assert torch.allclose(ws[key], (wa[key] + wb[key]) / 2, atol=1e-6)
    card = json.loads((soup / "model_card.json").read_text())
    assert card["training"]["soup"]["members"] == [str(a), str(b)]
    assert 0.0 < card["threshold"] < 1.0 and "offensive_f1" in card["metrics"]["test"]["bbf_multi_turn"]["all"]
    # checkpoints trained with another input encoding are refused
    other = tmp_path / "other"
    train(load_recipe("tiny", ["max_steps=2", "encoding.max_history_turns=1"]), FULL, other, progress=False)
    with pytest.raises(SoupError, match="encoding"):
        make_soup([a, other], tmp_path / "bad", FULL, progress=False)
    # mismatched shapes are refused with the parameter named
    with pytest.raises(SoupError, match="classifier.weight"):
        average_state_dicts([{"classifier.weight": torch.zeros(1, 4)}, {"classifier.weight": torch.zeros(2, 4)}])


def test_harmonised_heads_serve_the_offensive_head_and_compare_on_validation(tmp_path: Path) -> None:
    from lab.experiments.design_check import compare

    recipe = load_recipe("tiny", ["heads=harmonised", "epochs=1"])
    out = tmp_path / "harmonised"
    train(recipe, FULL, out, progress=False)
    card = json.loads((out / "model_card.json").read_text())
    assert card["heads"][0] == "offensive" and card["score_heads"] == ["offensive"]
    assert set(card["heads"]) == {"offensive", "unsafe_in_context"}  # the fixtures' families (+ the served head)
    assert "unsafe_in_context" in card["metrics"]["heads"]  # categories judged on their own family
    # the served score is the offensive head: predictions report every head as a category
    (pred,) = TorchClassifier(out).predict([Example.from_texts("you idiot")])
    assert set(pred.categories) == set(card["heads"]) and pred.score == pytest.approx(pred.categories["offensive"])
    result = compare([out, out], FULL)["checkpoints"][str(out)]
    assert set(result) >= {"source labels", "harmonised"}
    assert 0.0 <= result["harmonised"]["macro_f1"] <= 100.0


def test_capacity_probes_checkpoints_and_ensembles_on_validation(tiny_run: Path, tmp_path: Path) -> None:
    from lab.experiments.capacity import main as capacity

    out = tmp_path / "capacity"
    args = ["--config", "tiny", "--data-dir", str(FULL), "--encoder", "minilm", "--checkpoint", str(tiny_run)]
    assert capacity([*args, "--train-per-source", "12", "--valid-per-source", "8", "--out", str(out)]) == 0
    report = json.loads((out / "capacity.json").read_text())
    rows = report["rows"]
    name = f"fine-tuned {tiny_run.name}"
    assert set(rows) == {name, "frozen minilm", f"{name} + 0.25 x frozen minilm", f"{name} + 0.5 x frozen minilm"}
    assert all(set(r["f1"]) <= set(report["valid_per_source"]) for r in rows.values())
    # the checkpoint row is the trainer's own periodic check on the same rows (same threshold rule)
    assert 0.0 <= rows[name]["macro_f1"] <= 100.0
    assert len(list(out.glob("*.npy"))) == 2  # cached embeddings: train and valid sample


def test_macro_threshold_leaves_out_sources_without_positives() -> None:
    from dialogue_safety.training.calibration import choose_threshold

    rng = np.random.default_rng(0)
    gold = rng.integers(0, 2, 200)
    scored = (gold, np.clip(gold * 0.3 + rng.random(200) * 0.7, 0, 1))
    alone = choose_threshold({"a": scored}, "macro")
    with_safe_only = choose_threshold({"a": scored, "safe": (np.zeros(50, dtype=int), rng.random(50))}, "macro")
    assert with_safe_only == alone and "safe" not in with_safe_only[1]


def test_decomposed_model_trains_exports_and_keeps_the_history_out_of_the_utterance_heads(tmp_path: Path) -> None:
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.export.onnx_export import export_checkpoint

    recipe = load_recipe("tiny", ["heads=harmonised", "epochs=1", "encoding.context_mode=decomposed"])
    out = tmp_path / "decomposed"
    train(recipe, FULL, out, progress=False)
    card = json.loads((out / "model_card.json").read_text())
    assert card["score_heads"] == ["offensive", "unsafe_in_context"] and card["context_heads"] == ["unsafe_in_context"]
    reply = "yes you should do it"
    examples = [
        Example(utterance=reply),
        Example.from_texts(reply, ["should I hurt myself?"]),
        Example.from_texts(reply, ["what a lovely day", "should I learn to juggle?"]),
    ]
    torch_preds = TorchClassifier(out).predict(examples)
    # the utterance heads read the utterance alone: the history cannot move them
    assert len({round(p.categories["offensive"], 6) for p in torch_preds}) == 1
    # no history, no harm from it; with history the context head reads the dialogue
    assert torch_preds[0].categories["unsafe_in_context"] < 1e-6
    assert torch_preds[1].categories["unsafe_in_context"] != torch_preds[2].categories["unsafe_in_context"]
    for p in torch_preds:
        assert p.score == pytest.approx(max(p.categories["offensive"], p.categories["unsafe_in_context"]))
    exported = export_checkpoint(out, tmp_path / "model", variant_names=["fp32"])
    onnx_clf = OnnxClassifier(exported.out_dir, variant="fp32")
    # the two engines agree on every row the model reads (the dialogue, and the utterance alone),
    # within the fp32 order allowance (the scores follow from these logits)
    model, encoder, _ = load_checkpoint(out)
    rows = [r for e in encoder.encode_batch(examples) for r in (e, e.alone) if r is not None]
    assert_fp32_parity(onnx_clf.run_batch(rows), model, rows, encoder.pad_id)


def test_decomposed_encoding_needs_the_harmonised_context_head(tmp_path: Path) -> None:
    recipe = load_recipe("tiny", ["heads=shared", "encoding.context_mode=decomposed"])
    with pytest.raises(ValueError, match="decomposed' needs heads = 'harmonised'"):
        train(recipe, FULL, tmp_path / "x", progress=False)


def test_selection_objective_trades_f1_for_fewer_false_alarms_on_safe_only_sets() -> None:
    from dialogue_safety.training.calibration import choose_threshold
    from dialogue_safety.training.validation import score_valid_sets, selection_score, threshold_penalty

    # the positives score 0.45 and 0.9: the macro-best threshold catches both and flags 3 of the 4 SAFE-only sentences
    hate = (np.array([1, 1, 0, 0]), np.array([0.9, 0.45, 0.1, 0.2]))
    identity = (np.zeros(4, dtype=int), np.array([0.5, 0.5, 0.5, 0.1]))
    macro, _ = choose_threshold({"hate": hate, "identity": identity}, "macro")
    chosen, at = choose_threshold({"hate": hate, "identity": identity}, "selection", 0.5)
    assert macro <= 0.45 < 0.5 < chosen <= 0.9 and at == {"hate": pytest.approx(100 * 2 / 3)}
    assert choose_threshold({"hate": hate, "identity": identity}, "selection", 0.0)[0] == macro
    # the periodic check under the objective: its selection score is the objective's best value
    check = score_valid_sets({"hate": hate, "identity": identity}, 0.5)
    assert check["threshold"] == chosen and check["flagged_rate"] == {"identity": 0.0}
    assert selection_score(check, 0.5) == pytest.approx(100 * 2 / 3)
    assert selection_score(score_valid_sets({"hate": hate, "identity": identity}), 0.5) == pytest.approx(100 - 37.5)
    assert threshold_penalty(load_recipe("tiny", ["false_alarm_penalty=0.5"])) == 0.0
    assert threshold_penalty(load_recipe("tiny", ["false_alarm_penalty=0.5", "threshold_objective=selection"])) == 0.5


def test_the_general_moderation_guard_rejects_a_candidate_that_loses_general_recall() -> None:
    from dialogue_safety.training.calibration import RecallFloors, choose_threshold
    from dialogue_safety.training.validation import improves_on, score_valid_sets, selection_score

    floors = RecallFloors({"olid": 70.0}, penalty=1.0)
    gold = np.array([1, 1, 1, 1, 0, 0, 0, 0])
    # candidate A: perfect on the chatbot set, but catches 1 of OLID's 4 offensive tweets (25 %) at its threshold
    chat_a = (gold, np.array([0.9, 0.8, 0.8, 0.7, 0.1, 0.2, 0.1, 0.2]))
    olid_a = (gold, np.array([0.9, 0.15, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]))
    # candidate B: misses one chatbot positive, but keeps OLID's recall (3 of 4, 75 %)
    chat_b = (gold, np.array([0.9, 0.8, 0.8, 0.1, 0.1, 0.2, 0.1, 0.2]))
    olid_b = (gold, np.array([0.9, 0.8, 0.7, 0.2, 0.1, 0.1, 0.1, 0.1]))

    def check(chat: tuple[np.ndarray, np.ndarray], olid: tuple[np.ndarray, np.ndarray], guard: bool) -> dict:
        # OLID is guarded, not a threshold task: the threshold is tuned on the chatbot set alone
        c = score_valid_sets({"chat": chat}, 0.0, floors if guard else None, {"olid": olid})
        return {**c, "selection": selection_score(c, 0.0, floors if guard else None)}

    a, b = check(chat_a, olid_a, True), check(chat_b, olid_b, True)
    assert a["macro_f1"] > b["macro_f1"]  # A gains chatbot F1 ...
    assert a["general_recall"] == {"olid": pytest.approx(25.0)} and a["general_shortfall"] == pytest.approx(45.0)
    assert b["general_recall"] == {"olid": pytest.approx(75.0)} and b["general_shortfall"] == 0.0
    assert b["selection"] == pytest.approx(b["macro_f1"])  # above its floor, the guard costs nothing
    assert a["selection"] == pytest.approx(a["macro_f1"] - 45.0)
    # ... so keep-best keeps B whichever came first, and takes A over B without the guard
    assert not improves_on(a, b) and improves_on(b, a)
    a_plain, b_plain = check(chat_a, olid_a, False), check(chat_b, olid_b, False)
    assert "general_recall" not in a_plain and improves_on(a_plain, b_plain)
    # the threshold answers the same objective: A's threshold comes down to where OLID keeps its floor
    unguarded, _ = choose_threshold({"chat": chat_a}, "selection")
    guarded, _ = choose_threshold(
        {"chat": chat_a}, "selection", 0.0, RecallFloors({"olid": 50.0}, 10.0), {"olid": olid_a}
    )
    assert guarded <= 0.15 < unguarded
    with pytest.raises(ValueError, match=r"recall floors for \['ghc'\]"):
        RecallFloors({"ghc": 60.0}, 1.0).shortfall({"olid": 80.0})


def test_the_general_recall_floors_round_trip_through_the_recipe(tmp_path: Path) -> None:
    from dialogue_safety.training.recipe import recipe_from_dict

    r = load_recipe("tiny", ['general_recall_floors={"wtc": 70.5}', "general_recall_penalty=2"])
    assert r.general_recall_floors == {"wtc": 70.5} and r.general_recall_penalty == 2
    assert recipe_from_dict(r.to_dict()) == r
    dotted = load_recipe("tiny", ["general_recall_floors.diasafety=60", "general_recall_penalty=1"])
    assert dotted.general_recall_floors == {"diasafety": 60}
    toml = tmp_path / "guarded.toml"
    toml.write_text(  # a top-level key before the first table, the floors as a table of their own
        "general_recall_penalty = 1.5\n"
        + (Path(__file__).parents[1] / "recipes" / "tiny.toml").read_text()
        + '\n[general_recall_floors]\nwtc = 70.0\n"bbf_single_turn/standard" = 55.0\n'
    )
    assert load_recipe(str(toml)).general_recall_floors == {"wtc": 70.0, "bbf_single_turn/standard": 55.0}
    assert load_recipe("tiny").general_recall_floors == {}  # no guard unless a recipe sets one
    with pytest.raises(ValueError, match="are not tasks"):
        load_recipe("tiny", ['general_recall_floors={"hatecheck": 80}', "general_recall_penalty=1"])
    with pytest.raises(ValueError, match="general_recall_penalty must be > 0"):
        load_recipe("tiny", ['general_recall_floors={"wtc": 70}'])
    with pytest.raises(ValueError, match="percent"):
        load_recipe("tiny", ['general_recall_floors={"wtc": 170}', "general_recall_penalty=1"])


def test_a_guarded_run_logs_general_recall_and_keeps_the_best_selection(tmp_path: Path) -> None:
    floors = '{"bbf_single_turn/standard": 90, "diasafety": 90}'
    recipe = load_recipe(
        "tiny",
        [
            "max_steps=4",
            "eval_every=2",
            "keep_best=true",
            "threshold_objective=selection",  # the threshold holds the floors too
            f"general_recall_floors={floors}",
            "general_recall_penalty=1",
        ],
    )
    result = train(recipe, FULL, tmp_path / "guarded", progress=False)
    records = [json.loads(line) for line in (tmp_path / "guarded" / METRICS_FILE).read_text().splitlines()]
    checks = [r for r in records if r["event"] == "valid"]
    assert [r["step"] for r in checks] == [2, 4]
    for r in checks:
        assert set(r["general_recall"]) == {"bbf_single_turn/standard", "diasafety"}
        shortfall = sum(max(0.0, 90 - v) for v in r["general_recall"].values())
        assert r["general_shortfall"] == pytest.approx(shortfall)
        assert r["selection"] == pytest.approx(r["macro_f1"] - shortfall)
    assert result.card.training["selected_step"] == max(checks, key=lambda r: r["selection"])["step"]
    calibration = result.card.calibration
    assert calibration["general_recall_floors"] == {"bbf_single_turn/standard": 90, "diasafety": 90}
    assert set(calibration["general_recall_at_threshold"]) == {"bbf_single_turn/standard", "diasafety"}
    at = calibration["general_recall_at_threshold"]
    assert calibration["general_shortfall"] == pytest.approx(sum(max(0.0, 90 - v) for v in at.values()))
    # a floored task must have validation positives to measure recall on
    with pytest.raises(DataError, match="no validation positives"):
        train(
            load_recipe("tiny", ['general_recall_floors={"bbf_multi_turn": 50}', "general_recall_penalty=1"]),
            FULL,
            tmp_path / "multi",
            progress=False,
        )


def test_the_training_modules_import_downwards_from_the_loop() -> None:
    """The loop (``trainer``) sits on the modules cut from it; each imports only those below it, none the loop."""
    from tests.test_import_layers import GRAPH

    order = [
        "recipe",
        "mixture",
        "tasks",
        "heads",
        "calibration",
        "weight_average",
        "run_dir",
        "checkpoint",
        "inference",
        "validation",
        "final_evaluation",
        "trainer",
        "cli",
    ]
    full = {name: f"dialogue_safety.training.{name}" for name in order}
    upward = [
        f"{name} imports {other}"
        for i, name in enumerate(order)
        for other in order[i:]
        if full[other] in GRAPH[full[name]]
    ]
    assert not upward, "imports against the order of the training modules:\n" + "\n".join(upward)
    loop_users = {m for m, deps in GRAPH.items() if full["trainer"] in deps}
    assert loop_users == {full["cli"], "dialogue_safety.cli.fix_it"}


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("epochs=three", "epochs must be a number, got 'three'"),
        ("batch_size=0", "batch_size must be >= 1"),
        ("seed=1.5", "seed must be an integer"),
        ("freeze_word_embeddings=1", "freeze_word_embeddings must be true or false"),
        ("tasks.x=1", "tasks.<task>.<key>=VALUE"),
        ("tasks.diasafety.wieght=2", "unknown task keys: ['wieght']"),
    ],
)
def test_a_recipe_value_of_the_wrong_type_is_refused_at_load_naming_it(override: str, words: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_recipe("tiny", [override])
    assert words in str(caught.value)


def test_train_does_not_replace_a_finished_or_interrupted_run_unless_told(tmp_path: Path) -> None:
    from dialogue_safety.core.model_dir import CHECKPOINT_FILES
    from dialogue_safety.training.cli import main as train_main
    from dialogue_safety.training.run_dir import STATE_FILE

    finished, interrupted = tmp_path / "finished", tmp_path / "interrupted"
    finished.mkdir()
    for name in CHECKPOINT_FILES:
        (finished / name).write_text("{}")
    (interrupted / LAST_DIR).mkdir(parents=True)
    (interrupted / LAST_DIR / STATE_FILE).write_bytes(b"state")
    data = ["--config", "tiny", "--data-dir", str(Path(__file__).parent / "fixtures" / "sources" / "full")]
    assert train_main([*data, "--out", str(finished), "--no-progress"]) == 2
    assert train_main([*data, "--out", str(finished), "--resume", "--no-progress"]) == 2
    assert train_main([*data, "--out", str(interrupted), "--no-progress"]) == 2
    assert (finished / CHECKPOINT_FILES[0]).read_text() == "{}" and (interrupted / LAST_DIR / STATE_FILE).exists()
