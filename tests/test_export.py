"""ONNX export: self-describing model directory, torch parity, loud failures, fp16 weight storage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from dialogue_safety.core import variants
from dialogue_safety.core.encoding import DialogueEncoder
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import Example, Label, LabelledExample, Split
from dialogue_safety.core.variants.graphs import fold_fp16_weights, store_weights_fp16
from dialogue_safety.core.variants.stamps import file_sha256
from dialogue_safety.export import onnx_export
from dialogue_safety.export.cli import main as export_main
from dialogue_safety.export.comparison import choose_cpu_variant, compare_variants, gate, paired_bootstrap_delta_f1
from dialogue_safety.export.onnx_export import ExportError, ParityError, export_checkpoint, ort_logits, torch_logits
from dialogue_safety.training.checkpoint import load_checkpoint

FRESH = [
    Example.from_texts("a completely new utterance about nothing"),
    Example.from_texts("and another one", ["with", "three turns", "of history before it"]),
    Example.from_texts("short"),
    Example.from_texts(" ".join(["long"] * 300), ["context"]),
    Example.from_texts("emoji 😀 and numbers 42", ["hi"]),
]


@pytest.fixture(scope="module")
def shipped(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> onnx_export.ExportResult:
    out = tmp_path_factory.mktemp("export") / "shipped"
    return export_checkpoint(tiny_checkpoint, out, ship=True)


@pytest.fixture(scope="module")
def plain(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> onnx_export.ExportResult:
    out = tmp_path_factory.mktemp("export") / "plain"
    return export_checkpoint(tiny_checkpoint, out, variant_names=["fp32"])


def test_export_writes_a_self_describing_model_directory(shipped: onnx_export.ExportResult) -> None:
    out = shipped.out_dir
    for name in ("model.onnx", "tokenizer.json", "model_card.json", "MODEL_CARD.md", ".gitignore"):
        assert (out / name).is_file(), name
    card = ModelCard.load(out)
    assert card.variants == {
        "fp32": "model.fp32.onnx",
        "optimized": "model.optimized.onnx",
        "int8": "model.int8.onnx",
        "fp16": "model.fp16.onnx",
    }
    for name, file in card.variants.items():
        assert (out / file).is_file(), name
    export = card.export
    assert export["opset"] == onnx_export.DEFAULT_OPSET
    assert export["tolerance"] == 1e-4
    # within the floor or the fp32 order allowance (docs/runtime.md, export step 3), which is recorded
    assert 0 < export["parity"]["order_allowance_max"] < 1e-2
    assert 0 <= export["max_abs_diff"] <= max(1e-4, export["parity"]["order_allowance_max"])
    assert export["onnxruntime"] and export["weights_storage"] == "fp16"
    assert export["artifact_sha256"] == file_sha256(out / "model.onnx")
    assert export["geometry"]["num_attention_heads"] == 2
    assert set(export["recipes"]) == set(variants.VARIANT_NAMES)
    assert export["variants"]["optimized"]["max_abs_diff"] <= onnx_export.OPTIMIZED_TOLERANCE
    assert card.cpu_variant == "optimized" and "not validated" in export["cpu_variant_reason"]
    # nothing judged without test sets: the fallback is the one candidate, and no figures are recorded
    assert card.cpu_candidates == ["optimized"] and card.cpu_speed == {}
    assert card.name in (out / "MODEL_CARD.md").read_text()
    assert not list(out.parent.glob(".shipped.export-*")), "the staging folder is gone"


def test_onnx_signature_has_dynamic_batch_and_sequence(plain: onnx_export.ExportResult) -> None:
    graph = onnx.load(str(plain.out_dir / "model.onnx")).graph
    inputs = {i.name: i.type.tensor_type for i in graph.input}
    assert set(inputs) == {"input_ids", "attention_mask", "token_type_ids"}
    for t in inputs.values():
        assert t.elem_type == TensorProto.INT64
        assert [d.dim_param for d in t.shape.dim] == ["batch_size", "sequence_length"]
    (logits,) = graph.output
    assert logits.name == "logits"
    dims = logits.type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch_size" and dims[1].dim_value == 1


def test_onnx_matches_torch_on_fresh_dialogues(tiny_checkpoint: Path, plain: onnx_export.ExportResult) -> None:
    model, encoder, _ = load_checkpoint(tiny_checkpoint)
    encoded = encoder.encode_batch(FRESH)
    reference = torch_logits(model, encoded, encoder.pad_id)
    got = ort_logits(plain.out_dir / "model.onnx", encoded, encoder.pad_id)
    assert np.max(np.abs(got - reference)) <= 1e-4
    assert ModelCard.load(plain.out_dir).variants["fp32"] == "model.onnx"


def test_shipped_weights_are_fp16_and_fold_back_exactly(shipped: onnx_export.ExportResult) -> None:
    out = shipped.out_dir
    artifact = onnx.load(str(out / "model.onnx"))
    types = [i.data_type for i in artifact.graph.initializer if len(i.dims) >= 1 and np.prod(i.dims) >= 16]
    assert types.count(TensorProto.FLOAT16) >= 0.9 * len(types)
    folded = fold_fp16_weights(artifact)
    assert not any(i.data_type == TensorProto.FLOAT16 for i in folded.graph.initializer)
    assert not any(n.op_type == "Cast" and n.name.endswith("/cast_fp32") for n in folded.graph.node)
    # the shipped graph and the derived fp32 graph compute the same numbers
    enc = DialogueEncoder.from_file(out / "tokenizer.json", ModelCard.load(out).encoding_config)
    encoded = enc.encode_batch(FRESH)
    a = ort_logits(out / "model.onnx", encoded, enc.pad_id)
    b = ort_logits(out / "model.fp32.onnx", encoded, enc.pad_id)
    np.testing.assert_allclose(a, b, atol=1e-6)
    assert ModelCard.load(out).export["fp16_rounding_max_abs_diff"] < 1e-2


def test_store_weights_fp16_keeps_values_fp16_cannot_hold() -> None:
    from onnx import helper, numpy_helper

    big = numpy_helper.from_array(np.full((4, 8), -3.4e38, dtype=np.float32), "big")
    fine = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(4, 8) / 4, "fine")
    node = helper.make_node("Add", ["big", "fine"], ["y"])
    graph = helper.make_graph(
        [node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [big, fine]
    )
    stored, converted = store_weights_fp16(helper.make_model(graph))
    assert converted == 1
    kinds = {i.name: i.data_type for i in stored.graph.initializer}
    assert kinds["big"] == TensorProto.FLOAT and kinds["fine__fp16"] == TensorProto.FLOAT16
    folded = fold_fp16_weights(stored)
    arr = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}
    np.testing.assert_array_equal(arr["fine"], np.arange(32, dtype=np.float32).reshape(4, 8) / 4)


def test_parity_failure_is_loud_and_writes_nothing(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = onnx_export.torch_reference

    def off_by_a_hundredth(*args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        logits, allowance = real(*args, **kwargs)
        assert float(allowance.max()) < 1e-3  # the allowance does not hide a real difference
        return logits + 0.01, allowance

    monkeypatch.setattr(onnx_export, "torch_reference", off_by_a_hundredth)
    out = tmp_path / "model"
    with pytest.raises(ParityError, match=r"max \|onnx - torch\| logit difference 0\.01"):
        export_checkpoint(tiny_checkpoint, out, variant_names=["fp32"])
    assert not out.exists()
    assert not list(tmp_path.glob(".model.export-*"))
    rc = export_main([str(tiny_checkpoint), str(out), "--variants", "fp32", "-q"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "PARITY CHECK FAILED" in err and "0.01" in err
    assert not out.exists()


def test_cli_exports_and_reports(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli-model"
    rc = export_main([str(tiny_checkpoint), str(out), "--variants", "fp32", "--tolerance", "1e-3", "--no-eval"])
    assert rc == 0
    assert json.loads((out / "model_card.json").read_text())["export"]["tolerance"] == 1e-3
    assert "wrote" in capsys.readouterr().err


def test_cli_errors(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert export_main([str(tmp_path / "nope"), str(tmp_path / "out"), "-q"]) == 2
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "precious.txt").write_text("not a model")
    assert export_main([str(tiny_checkpoint), str(tmp_path / "busy"), "-q", "--no-eval"]) == 2
    assert "refusing" in capsys.readouterr().err
    with pytest.raises(ExportError, match="unknown variants"):
        export_checkpoint(tiny_checkpoint, tmp_path / "x", variant_names=["int4"])


def _labelled(utterance: str, offensive: bool) -> LabelledExample:
    return LabelledExample(utterance=utterance, label=Label.from_bool(offensive), source="fake", split=Split.TEST)


def test_compare_variants_reports_f1_and_changed_decisions(shipped: onnx_export.ExportResult) -> None:
    texts = [ex.utterance for ex in FRESH] + ["you idiot", "have a nice day", "shut up", "thank you so much"]
    split = [_labelled(t, i % 2 == 0) for i, t in enumerate(texts)]
    report = compare_variants(shipped.out_dir, {"fake/test": split, "fake/empty": []})
    assert report["reference"] == "fp32" and report["splits"] == {"fake/test": {"n": 9, "positives": 5}}
    assert set(report["variants"]) == {"fp32", "optimized", "int8"}
    fp32 = report["variants"]["fp32"]["fake/test"]
    assert fp32["delta_f1"] == 0 and fp32["changed_decisions"] == 0
    for v in ("optimized", "int8"):
        row = report["variants"][v]["fake/test"]
        assert 0 <= row["changed_decisions"] <= 1 and row["max_abs_score_diff"] < 0.05
        low, high = row["delta_f1_ci"]
        assert low <= row["delta_f1"] <= high
    assert set(report["gate"]) == {"fp32", "optimized", "int8"} and report["gate"]["fp32"]["passed"]
    assert report["gate_rule"]["resamples"] >= 1000


def _row(delta: float, ci: tuple[float, float], changed: float = 0.0) -> dict:
    return {"delta_f1": delta, "delta_f1_ci": list(ci), "changed_decisions": changed}


def test_gate_on_agreement_mean_and_interval() -> None:
    ok = {"a": _row(-0.4, (-1.2, 0.3)), "b": _row(0.2, (-0.3, 0.8))}
    assert gate(ok)["passed"] and gate(ok)["mean_delta_f1"] == pytest.approx(-0.1)
    # a loss the split resolves: its whole interval is below -0.5
    resolved = gate({"a": _row(-1.5, (-2.5, -0.6)), "b": _row(1.5, (0.5, 2.0))})
    assert not resolved["passed"] and resolved["splits_below_floor"] == ["a"]
    # the mean over the splits drops too far although no interval is resolved
    assert "mean ΔF1 -0.40" in gate({"a": _row(-0.4, (-1.0, 0.1)), "b": _row(-0.4, (-1.0, 0.1))})["why"]
    # too many changed decisions, whatever the F1 says
    changed = gate({"a": _row(0.0, (-0.1, 0.1), changed=0.011)})
    assert not changed["passed"] and "agreement 98.90 %" in changed["why"]


def test_choose_cpu_variant_by_the_gate() -> None:
    def report(int8_ok: bool, optimized_ok: bool) -> dict:
        return {
            "gate": {
                "fp32": {"passed": True, "why": "passes", "min_agreement": 1.0, "mean_delta_f1": 0.0},
                "optimized": {"passed": optimized_ok, "why": "o", "min_agreement": 1.0, "mean_delta_f1": 0.0},
                "int8": {
                    "passed": int8_ok,
                    "why": "mean ΔF1 -0.40 < -0.3",
                    "min_agreement": 0.995,
                    "mean_delta_f1": 0.1,
                },
            }
        }

    names = ["fp32", "optimized", "int8"]
    assert choose_cpu_variant(report(True, True), names)[0] == "int8"
    assert choose_cpu_variant(report(False, True), names)[0] == "optimized"
    variant, why = choose_cpu_variant(report(False, False), names)
    assert variant == "fp32" and "int8: mean ΔF1 -0.40 < -0.3" in why
    assert choose_cpu_variant(report(True, True), ["fp32", "optimized"])[0] == "optimized"
    assert choose_cpu_variant(None, names)[0] == "optimized"
    assert choose_cpu_variant(None, ["fp32"])[0] == "fp32"
    # with timings: the fastest that passes (fp32, the reference, always passes)
    timed = {**report(True, True), "seconds": {"fp32": 10.0, "optimized": 12.0, "int8": 6.0}}
    variant, why = choose_cpu_variant(timed, names)
    assert variant == "int8" and "fastest" in why and "fp32 10.0 s" in why
    timed["seconds"]["int8"] = 11.0
    assert choose_cpu_variant(timed, names)[0] == "fp32"  # optimized is slower than plain fp32 here
    timed = {**report(False, True), "seconds": {"fp32": 10.0, "optimized": 9.0, "int8": 1.0}}
    variant, why = choose_cpu_variant(timed, names)
    assert variant == "optimized" and "failed: int8: mean ΔF1 -0.40 < -0.3" in why


def test_paired_bootstrap_matches_a_hand_computed_case() -> None:
    # two positives, both caught by the reference, the second missed by the variant. Resampling two
    # items: (0,0) -> delta 0; (1,1) -> variant F1 0, delta -100; (0,1) or (1,0) -> variant F1 2/3,
    # delta -33.3. Expected delta over the resamples: (0 - 100 - 2 x 33.3) / 4 = -41.7; the 2.5 %
    # and 97.5 % points are -100 and 0.
    gold, reference, variant = np.array([1, 1]), np.array([1, 1]), np.array([1, 0])
    boot = paired_bootstrap_delta_f1(gold, reference, variant, resamples=20000, seed=1)
    assert boot["delta_f1"] == pytest.approx(100 * 2 / 3 - 100)
    assert boot["bootstrap_mean"] == pytest.approx(-41.67, abs=1.0)
    assert (boot["ci_low"], boot["ci_high"]) == (-100.0, 0.0)
    # the same decisions: a zero-width interval; seeded: the same answer twice
    same = paired_bootstrap_delta_f1(gold, reference, reference)
    assert (same["ci_low"], same["ci_high"], same["delta_f1"]) == (0.0, 0.0, 0.0)
    assert paired_bootstrap_delta_f1(gold, reference, variant) == paired_bootstrap_delta_f1(gold, reference, variant)


def test_model_card_markdown_renders_metric_tables() -> None:
    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.export.card_markdown import render_model_card

    row = {"n": 10, "positives": 4, "offensive_f1": 75.0, "precision": 60.0, "recall": 100.0, "pr_auc": 0.8125}
    card = ModelCard(
        name="m",
        version="1",
        heads=["offensive"],
        score_heads=["offensive"],
        threshold=0.4,
        metrics={
            "test": {
                "dynahate": {"all": row, "rounds": {"R1": {**row, "n": 6, "offensive_f1": 50.0}}},
                "hatecheck": {"all": {**row, "accuracy": 81.25}},
            },
            "valid": {"dynahate": {"all": row}},
        },
        calibration={
            "temperatures": {"offensive": 1.5},
            "ece_before": {"offensive": 0.1},
            "ece_after": {"offensive": 0.05},
            "threshold": 0.4,
            "threshold_objective": "macro",
        },
        training={
            "examples": {"dynahate": {"train": 1200, "valid": 10, "test": 10}},
            "steps": 7,
            "recipe": {"name": "r", "epochs": 2.0, "learning_rate": 5e-5},
        },
        licences={"dynahate": "MIT"},
    )
    md = render_model_card(card)
    assert "| **dynahate** | 10 | 4 | 75.0 | 60.0 | 100.0 | — | 0.812 |" in md
    assert "| dynahate / R1 | 6 | 4 | 50.0 |" in md
    assert "hatecheck accuracy (the suite's headline metric): 81.2" in md
    assert "### valid splits (threshold 0.4)" in md
    assert "temperature 1.5; expected calibration error on valid 0.1 → 0.05" in md
    assert "| dynahate | 1,200 | 10 | 10 | MIT |" in md
    assert "chosen on the validation sets (macro OFFENSIVE-F1 over sources)" in md
    card.calibration = {**card.calibration, "threshold_objective": "selection", "false_alarm_penalty": 0.5}
    assert "(the mean OFFENSIVE-F1 over sources less 0.5 points per point flagged of the SAFE-only sets)" in (
        render_model_card(card)
    )


def test_the_card_keeps_each_number_once_and_older_cards_still_read(tmp_path: Path) -> None:
    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.export import card_markdown

    older = {  # a card written before: threshold and temperatures also inside calibration
        "name": "m",
        "heads": ["offensive"],
        "temperatures": {"offensive": 1.3},
        "threshold": 0.415,
        "calibration": {"temperatures": {"offensive": 1.3}, "threshold": 0.415, "threshold_objective": "macro"},
    }
    (tmp_path / "model_card.json").write_text(json.dumps(older), encoding="utf-8")
    card = ModelCard.load(tmp_path)
    assert (card.threshold, card.temperatures) == (0.415, {"offensive": 1.3})
    assert card.calibration == {"threshold_objective": "macro"}
    only_the_copy = ModelCard.model_validate({"calibration": {"threshold": 0.3, "temperatures": {"offensive": 2.0}}})
    assert (only_the_copy.threshold, only_the_copy.temperatures, only_the_copy.calibration) == (
        0.3,
        {"offensive": 2.0},
        {},
    )
    # the card writer rewrites both files in the current form
    assert card_markdown.main([str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "model_card.json").read_text(encoding="utf-8"))
    assert saved["threshold"] == 0.415 and "threshold" not in saved["calibration"]
    md = (tmp_path / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert md.count("0.415") == 1 and md.count("1.3") == 1


def test_the_shipped_card_holds_each_number_once_and_its_markdown_is_rendered_from_it() -> None:
    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.export.card_markdown import render_model_card

    shipped = Path(__file__).resolve().parents[1] / "models" / "default"
    raw = json.loads((shipped / "model_card.json").read_text(encoding="utf-8"))
    assert not {"threshold", "temperatures"} & set(raw["calibration"])
    assert (shipped / "MODEL_CARD.md").read_text(encoding="utf-8") == render_model_card(ModelCard.load(shipped))
