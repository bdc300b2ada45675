"""Calibrated static int8: the calibration file in the model directory, the QDQ derivation, the recipe choice."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest

from dialogue_safety.core import variants
from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import CALIBRATION_FILE
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example, Label, LabelledExample, Split, Turn
from dialogue_safety.core.variants.calibration import CalibrationError, load_calibration, save_calibration
from dialogue_safety.core.variants.stamps import file_sha256
from dialogue_safety.export import onnx_export
from dialogue_safety.export.quantization import calibration_split, candidate_recipes

TEXTS = [
    ("you are an idiot", []),
    ("thanks, that was helpful", ["can you help me?"]),
    ("shut up", ["hello", "what do you want"]),
    ("have a nice day", []),
    ("people like you are the worst", ["why?"]),
    ("ok", ["hi"]),
    ("i love this", ["look at my dog"]),
    ("go away", []),
]


def _split(name: str, n: int, split: Split) -> list[LabelledExample]:
    return [
        LabelledExample(
            utterance=f"{TEXTS[i % len(TEXTS)][0]} {i}",
            history=tuple(Turn(t) for t in TEXTS[i % len(TEXTS)][1]),
            label=Label.from_bool(i % 3 == 0),
            source=name,
            split=split,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def exported(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> onnx_export.ExportResult:
    out = tmp_path_factory.mktemp("quant") / "model"
    validation = {"a/valid": _split("a", 80, Split.VALID), "b/valid": _split("b", 70, Split.VALID)}
    tests = {"a/test": _split("a", 40, Split.TEST)}
    return onnx_export.export_checkpoint(
        tiny_checkpoint,
        out,
        variant_names=["fp32", "optimized", "int8"],
        ship=True,
        test_sets=tests,
        validation_sets=validation,
        int8_candidates=["static", "all"],
    )


def test_calibration_file_round_trips_and_is_byte_stable(tmp_path: Path) -> None:
    rows = [EncodedExample((101, 7, 102), (0, 0, 0), (1, 1, 1)), EncodedExample((101, 9, 102, 8, 102), (0, 0, 0, 1, 1))]
    first = save_calibration(tmp_path / "a.npz", rows, ["x/valid", "y/valid"])
    second = save_calibration(tmp_path / "b.npz", rows, ["x/valid", "y/valid"])
    assert first.read_bytes() == second.read_bytes()  # fixed zip timestamps: same rows, same bytes
    loaded, sources = load_calibration(first)
    assert [r.input_ids for r in loaded] == [r.input_ids for r in rows] and sources == ["x/valid", "y/valid"]
    assert [r.token_type_ids for r in loaded] == [r.token_type_ids for r in rows]
    with pytest.raises(CalibrationError, match="no calibration file"):
        load_calibration(tmp_path / "absent.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(CalibrationError, match="unreadable"):
        load_calibration(tmp_path / "bad.npz")


def test_calibration_split_is_seeded_and_disjoint() -> None:
    sets = {"a/valid": _split("a", 100, Split.VALID), "b/valid": _split("b", 30, Split.VALID)}
    calibration, held_out = calibration_split(sets, per_source=20)
    again, _ = calibration_split(sets, per_source=20)
    assert calibration == again and {k: len(v) for k, v in calibration.items()} == {"a/valid": 20, "b/valid": 20}
    assert {k: len(v) for k, v in held_out.items()} == {"a/valid": 80, "b/valid": 10}
    for name in sets:
        assert not {ex.utterance for ex in calibration[name]} & {ex.utterance for ex in held_out[name]}


def test_static_presets_need_a_calibration_set() -> None:
    recipes, notes = candidate_recipes(["static", "vnni"], None)
    assert list(recipes) == ["vnni"] and "static" in notes[0]
    recipes, _ = candidate_recipes(["static"], {"sha256": "abc"})
    assert recipes["static"]["calibration_sha256"] == "abc" and recipes["static"]["from"] == "fp32"
    with pytest.raises(ValueError, match="unknown int8 preset"):
        candidate_recipes(["nope"], None)


def test_export_writes_the_calibration_set_and_the_int8_choice(exported: onnx_export.ExportResult) -> None:
    out = exported.out_dir
    card = ModelCard.load(out)
    record = card.export["calibration"]
    path = out / CALIBRATION_FILE
    assert record["file"] == CALIBRATION_FILE and record["sha256"] == file_sha256(path)
    rows, sources = load_calibration(path)
    assert len(rows) == record["rows"] >= 2 * 60 and set(sources) == {"a/valid", "b/valid"}
    assert path.stat().st_size < 300_000
    assert CALIBRATION_FILE not in (out / ".gitignore").read_text()  # committed with the model
    selection = card.export["int8_selection"]
    tried = list(selection["candidates"])
    assert tried[0] == "static" and set(selection["splits"]) == {"a/valid", "b/valid"}
    assert selection["splits"]["a/valid"] == 20  # 80 minus the 60 calibration dialogues
    passed = [name for name in tried if selection["candidates"][name]["gate"]["passed"]]
    assert passed == ([selection["chosen"]] if selection["passed"] else [])  # stops at the first that passes
    assert card.export["recipes"]["int8"]["preset"] == selection["chosen"]
    assert "int8" in card.export["comparison"]["gate"]  # confirmed on the test splits


def _static_graph(model_dir: Path) -> onnx.ModelProto:
    card = ModelCard.load(model_dir)
    recipe = {**variants.INT8_PRESETS["static"], "calibration_sha256": card.export["calibration"]["sha256"]}
    fp32 = onnx.load(str(variants.ensure_variant(model_dir, "fp32", card)))
    return variants.derive(fp32, recipe, calibration=model_dir / CALIBRATION_FILE)


def test_static_int8_quantises_the_linear_layers_only_and_keeps_the_residual_fp32(
    exported: onnx_export.ExportResult,
) -> None:
    graph = _static_graph(exported.out_dir)
    producer = {o: n for n in graph.graph.node for o in n.output}
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("QuantizeLinear") > 0
    for node in graph.graph.node:
        from_dq = [i for i in node.input if i in producer and producer[i].op_type == "DequantizeLinear"]
        if node.op_type == "MatMul" and re.search(variants.ATTENTION_SCORES, node.name):
            assert not from_dq, node.name  # the attention score products stay fp32
        elif node.op_type not in ("MatMul", "QuantizeLinear", "DequantizeLinear"):
            assert not from_dq, f"{node.op_type} {node.name} reads a quantised tensor"  # residual stream fp32
    assert not any(
        producer.get(n.input[0]) is not None and producer[n.input[0]].op_type == "MatMul"
        for n in graph.graph.node
        if n.op_type == "QuantizeLinear"
    )  # MatMul outputs are not re-quantised


def test_static_int8_is_derived_deterministically_and_close_to_fp32(exported: onnx_export.ExportResult) -> None:
    out = exported.out_dir
    assert _static_graph(out).SerializeToString() == _static_graph(out).SerializeToString()
    examples = [Example.from_texts(t, h) for t, h in TEXTS]
    card = ModelCard.load(out)
    card.export["recipes"]["int8"] = {
        "from": "fp32",
        **variants.INT8_PRESETS["static"],
        "calibration_sha256": card.export["calibration"]["sha256"],
    }
    card.save(out)
    static = OnnxClassifier(out, variant="int8", providers=["CPUExecutionProvider"]).logits(examples)
    fp32 = OnnxClassifier(out, variant="fp32", providers=["CPUExecutionProvider"]).logits(examples)
    assert np.all(np.isfinite(static)) and np.max(np.abs(static - fp32)) < 0.2


def test_static_int8_refuses_a_missing_or_different_calibration_file(
    exported: onnx_export.ExportResult, tmp_path: Path
) -> None:
    card = ModelCard.load(exported.out_dir)
    fp32 = onnx.load(str(variants.ensure_variant(exported.out_dir, "fp32", card)))
    recipe = {**variants.INT8_PRESETS["static"], "calibration_sha256": card.export["calibration"]["sha256"]}
    with pytest.raises(variants.VariantError, match="calibration"):
        variants.derive(fp32, recipe, calibration=tmp_path / CALIBRATION_FILE)
    with pytest.raises(variants.VariantError, match="needs the model directory"):
        variants.derive(fp32, recipe)
    other = save_calibration(tmp_path / CALIBRATION_FILE, [EncodedExample((2, 3), (0, 0), (1, 1))], ["x"])
    with pytest.raises(variants.VariantError, match="not the calibration set"):
        variants.derive(fp32, recipe, calibration=other)


def test_nbits8_is_blockwise_int8_on_the_optimized_graph(exported: onnx_export.ExportResult) -> None:
    out = exported.out_dir
    card = ModelCard.load(out)
    optimized = onnx.load(str(variants.ensure_variant(out, "optimized", card)))
    recipe = variants.INT8_PRESETS["nbits8"]
    graph = variants.derive(optimized, recipe)
    assert graph.SerializeToString() == variants.derive(optimized, recipe).SerializeToString()
    ops = [n.op_type for n in graph.graph.node]
    assert "MatMulNBits" in ops and "MatMul" not in ops
    nbits = next(n for n in graph.graph.node if n.op_type == "MatMulNBits")
    attrs = {a.name: a.i for a in nbits.attribute}
    assert attrs["bits"] == 8 and attrs["block_size"] == 128 and attrs["accuracy_level"] == 4
    card.export["recipes"]["int8"] = dict(recipe)
    card.save(out)
    examples = [Example.from_texts(t, h) for t, h in TEXTS]
    int8 = OnnxClassifier(out, variant="int8", providers=["CPUExecutionProvider"]).logits(examples)
    fp32 = OnnxClassifier(out, variant="fp32", providers=["CPUExecutionProvider"]).logits(examples)
    assert np.max(np.abs(int8 - fp32)) < 0.05


def test_8_bit_int8_recipes_fall_back_to_optimized_on_x86_without_vnni() -> None:
    from dialogue_safety.core.runtime import int8_supported

    for preset in ("nbits8", "static", "vnni"):
        card = ModelCard(name="m", version="0", export={"recipes": {"int8": dict(variants.INT8_PRESETS[preset])}})
        assert int8_supported(card, "flags\t: fpu sse2 avx2 fma")[0] is False, preset  # AVX2 only: can saturate
        assert int8_supported(card, "flags\t: fpu avx2 avx512f avx512_vnni")[0] is True, preset
        assert int8_supported(card, "Features\t: fp asimd asimddp")[0] is True, preset  # ARM: exact int8 kernels
