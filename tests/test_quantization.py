"""Calibrated static int8: the calibration file in the model directory, the QDQ derivation, the recipe choice."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
from dialogue_safety.export import onnx_export, quantization
from dialogue_safety.export.card_markdown import int8_candidate_verdict
from dialogue_safety.export.quantization import (
    CHECK_MIN_AGREEMENT,
    calibration_split,
    candidate_recipes,
    check_band_for,
    checked_scores,
    served_seconds,
)
from lab.int8_presets import INT8_PRESETS as LAB_INT8_PRESETS
from lab.int8_presets import RESEARCH_INT8_PRESETS

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
    recipes, notes = candidate_recipes(["static", "dynamic"], None)
    assert list(recipes) == ["dynamic"] and "static" in notes[0]
    recipes, _ = candidate_recipes(["static"], {"sha256": "abc"})
    assert recipes["static"]["calibration_sha256"] == "abc" and recipes["static"]["from"] == "fp32"
    with pytest.raises(ValueError, match="unknown int8 preset"):
        candidate_recipes(["nope"], None)
    with pytest.raises(ValueError, match="unknown int8 preset 'vnni'"):  # research: lab/int8_presets.py
        candidate_recipes(["vnni"], None)


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
    assert tried == ["static", "all"]  # every candidate is judged
    passed = [
        name
        for name in tried
        if selection["candidates"][name]["check"]["band"] is not None
        and selection["candidates"][name]["batch_dependence"]["steady"]
        and not selection["candidates"][name].get("judged_without_vnni")  # 8-bit, on a CPU without VNNI
    ]
    assert selection["passed"] == bool(passed) and selection["fp32_seconds"] > 0
    assert selection["candidates"]["all"]["portable"] and not selection["candidates"]["static"]["portable"]
    if selection["export_cpu_vnni"] is False:  # this CPU saturates 8-bit products: only portable ones are kept
        assert "static" not in passed
    if passed:  # by the served cost (int8 + fp32 for the checked share) and portability: choose_candidate
        cost = {n: selection["candidates"][n]["served_seconds"] for n in passed}
        portable = {n: selection["candidates"][n]["portable"] for n in passed}
        assert selection["chosen"] == quantization.choose_candidate(cost, portable)
        entry = selection["candidates"][selection["chosen"]]
        assert cost[selection["chosen"]] == pytest.approx(
            served_seconds(entry["seconds"], entry["check"]["checked_fraction"], selection["fp32_seconds"]),
            abs=1e-3,
        )
    assert card.export["recipes"]["int8"]["preset"] == selection["chosen"]
    if selection["passed"]:  # alone (band 0, no check in the card) or with the narrowest passing check
        band = selection["candidates"][selection["chosen"]]["check"]["band"]
        assert (card.export.get("int8_verify") or {}).get("band", 0.0) == band
    assert "int8" in card.export["comparison"]["gate"]  # confirmed on the test splits


def _static_graph(model_dir: Path, **overrides: Any) -> onnx.ModelProto:
    card = ModelCard.load(model_dir)
    recipe = {**variants.INT8_PRESETS["static"], "calibration_sha256": card.export["calibration"]["sha256"]}
    fp32 = onnx.load(str(variants.ensure_variant(model_dir, "fp32", card)))
    return variants.derive(fp32, {**recipe, **overrides}, calibration=model_dir / CALIBRATION_FILE)


INTEGER_MATMULS = ("MatMul", "MatMulIntegerToFloat")  # QDQ form, and after the CPU kernel rewrites


@pytest.mark.parametrize("rewrites", [[], list(variants.rewrites.REWRITES)], ids=["qdq", "rewritten"])
def test_static_int8_quantises_the_linear_layers_only_and_keeps_the_residual_fp32(
    exported: onnx_export.ExportResult, rewrites: list[str]
) -> None:
    graph = _static_graph(exported.out_dir, rewrites=rewrites)
    producer = {o: n for n in graph.graph.node for o in n.output}
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("QuantizeLinear") > 0
    readers = 0
    for node in graph.graph.node:
        from_int8 = [
            i for i in node.input if i in producer and producer[i].op_type in ("QuantizeLinear", "DequantizeLinear")
        ]
        if node.op_type in ("MatMul", "FusedMatMul") and re.search(variants.ATTENTION_SCORES, node.name):
            assert not from_int8, node.name  # the attention score products stay fp32
        elif node.op_type not in (*INTEGER_MATMULS, "DequantizeLinear"):
            assert not from_int8, f"{node.op_type} {node.name} reads a quantised tensor"  # residual stream fp32
        readers += bool(from_int8)
    assert readers >= 6 * 2  # the tiny model's two layers: q, k, v, attention output, up, down
    assert not any(
        producer.get(n.input[0]) is not None and producer[n.input[0]].op_type in INTEGER_MATMULS
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


def test_the_choice_prefers_the_cheapest_then_a_portable_recipe_unless_8_bit_is_clearly_cheaper() -> None:
    choose = quantization.choose_candidate
    margin, portable_margin = quantization.COST_MARGIN, quantization.PORTABLE_MARGIN
    assert margin < portable_margin
    # among recipes alike, the first within COST_MARGIN of the cheapest
    assert choose({"a": 1.0, "b": 1.0 - margin / 2}, {"a": False, "b": False}) == "a"
    assert choose({"a": 1.0, "b": 1.0 - 2 * margin}, {"a": False, "b": False}) == "b"
    # a portable recipe (the same on every CPU) stays unless an 8-bit one is PORTABLE_MARGIN cheaper
    seven = {"eight": False, "seven": True}
    assert choose({"eight": 1.0, "seven": 1.0 + portable_margin / 2}, seven) == "seven"
    assert choose({"eight": 1.0, "seven": 1.0 / (1 - portable_margin) + 0.01}, seven) == "eight"
    assert choose({"eight": 1.0}, {"eight": False}) == "eight"  # no portable one passed
    # the cheapest of several portable ones (COST_MARGIN among them too), order kept for near ties
    # against the cheapest portable one: 7 % cheaper than it is not enough, though 11 % under a dearer one
    assert choose({"eight": 0.93, "p1": 1.05, "p2": 1.0}, {"eight": False, "p1": True, "p2": True}) == "p1"
    three = {"eight": False, "p1": True, "p2": True}
    assert choose({"eight": 1.0, "p1": 1.05, "p2": 1.06}, three) == "p1"
    assert choose({"eight": 1.0, "p1": 1.3, "p2": 1.05}, three) == "p2"
    # the 7-bit preset is portable, its 8-bit twin is not (runtime.portable_int8 owns the rule)
    from dialogue_safety.core.runtime import portable_int8

    assert portable_int8(variants.INT8_PRESETS["static-split-lean-7bit"])
    assert not portable_int8(variants.INT8_PRESETS["static-split-lean"])
    assert "static-split-lean-7bit" in variants.INT8_CANDIDATES


def test_the_package_ships_only_the_int8_presets_the_product_can_select() -> None:
    # the export's candidates and the default recipe's preset; research presets live in lab/
    assert set(variants.INT8_PRESETS) == {*variants.INT8_CANDIDATES, "all"}
    assert variants.DEFAULT_RECIPES["int8"] == {"from": "optimized", **variants.INT8_PRESETS["all"]}
    assert not set(RESEARCH_INT8_PRESETS) & set(variants.INT8_PRESETS)
    assert LAB_INT8_PRESETS == {**variants.INT8_PRESETS, **RESEARCH_INT8_PRESETS}


def test_8_bit_int8_recipes_fall_back_to_an_exact_variant_on_x86_without_vnni() -> None:
    from dialogue_safety.core.runtime import exact_cpu_fallback, int8_supported

    for preset in ("dynamic", "nbits8", "static", "vnni", "static-split-lean"):
        card = ModelCard(name="m", version="0", export={"recipes": {"int8": dict(LAB_INT8_PRESETS[preset])}})
        assert int8_supported(card, "flags\t: fpu sse2 avx2 fma")[0] is False, preset  # AVX2 only: can saturate
        assert int8_supported(card, "flags\t: fpu avx2 avx512f avx512_vnni")[0] is True, preset
        assert int8_supported(card, "Features\t: fp asimd asimddp")[0] is True, preset  # ARM: exact int8 kernels
    for preset in ("all", "attention", "static-split-lean-7bit"):  # 7-bit weights: served everywhere
        card = ModelCard(name="m", version="0", export={"recipes": {"int8": dict(LAB_INT8_PRESETS[preset])}})
        assert int8_supported(card, "flags\t: fpu sse2 avx2 fma")[0] is True, preset
    # the fallback is the faster of the two fp32-exact variants in the export's timings
    card = ModelCard(name="m", version="0", export={"comparison": {"seconds": {"fp32": 5.0, "optimized": 6.0}}})
    assert exact_cpu_fallback(card) == "fp32"
    card.export["comparison"]["seconds"]["optimized"] = 4.0
    assert exact_cpu_fallback(card) == "optimized"
    assert exact_cpu_fallback(ModelCard(name="m", version="0")) == "optimized"


def _with_int8_recipe(model_dir: Path, preset: str, band: float = 0.0) -> ModelCard:
    """The card with an int8 recipe of ``preset`` (the product's presets, or the lab's research ones)."""
    card = ModelCard.load(model_dir)
    recipe = {"from": "optimized", **LAB_INT8_PRESETS[preset], "preset": preset}
    if variants.needs_calibration(recipe):
        recipe["calibration_sha256"] = card.export["calibration"]["sha256"]
    card.export["recipes"]["int8"] = recipe
    card.export.pop("int8_verify", None)
    if band:
        card.export["int8_verify"] = {"band": band, "against": "fp32"}
    card.save(model_dir)
    return card


def test_dynamic_int8_quantises_the_linear_layers_of_the_fp32_graph(exported: onnx_export.ExportResult) -> None:
    out = exported.out_dir
    card = _with_int8_recipe(out, "dynamic")
    assert variants.recipe_chain("int8", card)[-2][0] == "fp32"  # not the optimizer's fused graph
    graph = onnx.load(str(variants.ensure_variant(out, "int8", card, force=True)))
    ops = [n.op_type for n in graph.graph.node]
    assert "MatMulInteger" in ops and "DynamicQuantizeLinear" in ops and "Attention" not in ops
    float_matmuls = [n.name for n in graph.graph.node if n.op_type == "MatMul"]
    assert float_matmuls and all(re.search(variants.ATTENTION_SCORES, n) for n in float_matmuls)  # QK^T, PV
    weights = {i.name: i for i in graph.graph.initializer}
    scales = [weights[n.input[1]] for n in graph.graph.node if n.op_type == "Mul" and n.input[1] in weights]
    assert any(len(s.dims) == 1 and s.dims[0] > 1 for s in scales)  # per-channel weight scales


def _fp32_and_feeds(model_dir: Path) -> tuple[ModelCard, onnx.ModelProto, list[dict[str, np.ndarray]]]:
    """The card, the fp32 graph and the calibration feeds of an exported model directory."""
    from dialogue_safety.core.variants.calibration import calibration_feeds

    card = ModelCard.load(model_dir)
    fp32 = onnx.load(str(variants.ensure_variant(model_dir, "fp32", card)))
    return card, fp32, calibration_feeds(model_dir / CALIBRATION_FILE)


def _outputs(a: onnx.ModelProto, b: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> Iterator[tuple[Any, Any]]:
    """The logits of graphs ``a`` and ``b`` on each feed, side by side."""
    import onnxruntime as ort

    sa = ort.InferenceSession(a.SerializeToString(), providers=["CPUExecutionProvider"])
    sb = ort.InferenceSession(b.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sa.get_inputs()}
    for feed in feeds:
        feed = {k: v for k, v in feed.items() if k in names}
        yield sa.run(None, feed)[0], sb.run(None, feed)[0]


def test_outlier_channels_are_computed_apart_in_fp32_and_change_nothing_in_fp32(
    exported: onnx_export.ExportResult,
) -> None:
    from dialogue_safety.core.variants.graphs import FP32_OUTLIERS, quantize, split_outlier_channels

    _, fp32, feeds = _fp32_and_feeds(exported.out_dir)
    split, n = split_outlier_channels(fp32, feeds[:20], (variants.FFN_UP, variants.FFN_DOWN), channels=2)
    assert n == 2 * 2  # the tiny model's two layers, up and down each
    for x, y in _outputs(fp32, split, feeds[20:30]):
        np.testing.assert_allclose(x, y, atol=1e-5)
    quantized = quantize(split, RESEARCH_INT8_PRESETS["dynamic-split"])
    kept = [n for n in quantized.graph.node if FP32_OUTLIERS in n.name and n.op_type == "MatMul"]
    assert len(kept) == 4  # the outlier products stay fp32 MatMuls
    assert not any(FP32_OUTLIERS in n.name for n in quantized.graph.node if n.op_type == "MatMulInteger")


def test_int8_check_answers_fp32_near_the_threshold_and_int8_elsewhere(exported: onnx_export.ExportResult) -> None:
    out = exported.out_dir
    card = _with_int8_recipe(out, "dynamic")
    examples = [Example.from_texts(f"{t} {i}", h) for i in range(6) for t, h in TEXTS]
    cpu = ["CPUExecutionProvider"]
    fp32 = OnnxClassifier(out, variant="fp32", providers=cpu).predict_proba(examples)
    alone = OnnxClassifier(out, variant="int8", providers=cpu).predict_proba(examples)  # no check in the card
    t = card.threshold
    band = float(np.median(np.abs(alone - t)))  # about half the dialogues are near
    _with_int8_recipe(out, "dynamic", band=band)
    served = OnnxClassifier(out, variant="int8", providers=cpu)
    checked = served.predict_proba(examples)
    near = np.abs(alone - t) < band
    assert 0 < near.sum() < len(examples) and not np.allclose(alone[near], fp32[near], atol=1e-6)
    assert served.check_band == band and served.checked_items == int(near.sum())
    np.testing.assert_allclose(checked[near], fp32[near], atol=1e-6)
    np.testing.assert_allclose(checked[~near], alone[~near], atol=1e-6)
    unchecked = OnnxClassifier(out, variant="int8", providers=cpu, int8_check=False).predict_proba(examples)
    np.testing.assert_allclose(unchecked, alone, atol=1e-6)
    # a band wider than any score error keeps every decision; another threshold in force is covered too
    _with_int8_recipe(out, "dynamic", band=1.0)
    np.testing.assert_allclose(
        OnnxClassifier(out, variant="int8", providers=cpu).predict_proba(examples), fp32, atol=1e-6
    )
    other = OnnxClassifier(out, variant="int8", providers=cpu, thresholds=(0.9,))
    assert other.check_thresholds == tuple(sorted({t, 0.9}))
    assert OnnxClassifier(out, variant="fp32", providers=cpu).check_band == 0.0  # only int8 is checked
    _with_int8_recipe(out, "dynamic")


def test_checked_scores_take_fp32_only_within_the_band() -> None:
    int8 = np.array([0.10, 0.48, 0.53, 0.90])
    fp32 = np.array([0.11, 0.52, 0.49, 0.91])
    np.testing.assert_allclose(checked_scores(int8, fp32, [0.5], 0.03), [0.10, 0.52, 0.53, 0.90])
    np.testing.assert_allclose(checked_scores(int8, fp32, [0.5], 0.04), [0.10, 0.52, 0.49, 0.90])
    np.testing.assert_allclose(checked_scores(int8, fp32, [0.5, 0.9], 0.025), [0.10, 0.52, 0.53, 0.91])


def test_check_band_is_the_narrowest_that_passes_the_gate() -> None:
    rng = np.random.default_rng(0)
    n = 400
    gold = {"a": (np.arange(n) % 2 == 0).astype(int)}
    fp32 = np.where(gold["a"] == 1, rng.uniform(0.7, 0.99, n), rng.uniform(0.01, 0.3, n))
    flips = np.arange(0, 40, 2)[:8]  # 8 positives (2 % of the split) that int8 moves just under 0.5
    fp32[flips] = 0.52
    int8 = fp32.copy()
    int8[flips] = 0.475  # 0.025 from the threshold: caught by a band of 0.03, not by 0.02
    chosen = check_band_for(gold, {"a": fp32}, {"a": int8}, 0.5)
    assert chosen["band"] == 0.03
    assert chosen["checked_fraction"] == 8 / n and chosen["gate"]["min_agreement"] == 1.0
    assert chosen["tried"]["0"]["min_agreement"] == 1 - 8 / n  # int8 alone: 98 %, fails
    assert chosen["tried"]["0.02"]["checked_fraction"] == 0.0
    # a band passing the gate (99 %) but short of CHECK_MIN_AGREEMENT is not enough
    int8[flips[:3]] = 0.44  # 3 of 400 beyond 0.05: 99.25 % at every band up to 0.06
    chosen = check_band_for(gold, {"a": fp32}, {"a": int8}, 0.5, bands=(0.0, 0.03, 0.06, 0.1))
    assert 1 - 3 / n < CHECK_MIN_AGREEMENT and chosen["band"] == 0.1
    assert check_band_for(gold, {"a": fp32}, {"a": int8}, 0.5, bands=(0.0, 0.03))["band"] is None


def test_dynamic_int8_scores_move_with_the_batch_and_static_ones_do_not(
    exported: onnx_export.ExportResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dialogue_safety.export import quantization

    monkeypatch.setattr(quantization, "BATCH_TOLERANCE", 1e-6)  # the tiny model's activations are tame
    out = exported.out_dir
    held_out = {"a/valid": _split("a", 60, Split.VALID), "b/valid": _split("b", 30, Split.VALID)}
    _with_int8_recipe(out, "static")
    static = quantization.batch_dependence(out, held_out)
    assert static["dialogues"] == 70 and static["steady"] and static["max_abs_score_diff"] < 1e-6
    _with_int8_recipe(out, "dynamic")
    dynamic = quantization.batch_dependence(out, held_out)  # one scale per batch tensor: neighbours share it
    assert dynamic["max_abs_score_diff"] > 1e-5 and not dynamic["steady"]


def test_the_lean_split_drops_its_masks_and_splits_only_layers_with_outliers(
    exported: onnx_export.ExportResult,
) -> None:
    from dialogue_safety.core.variants.graphs import FP32_OUTLIERS, quantize_static_qdq, split_outlier_channels

    out = exported.out_dir
    card, fp32, feeds = _fp32_and_feeds(out)
    recipe = {**variants.INT8_PRESETS["static-split-lean"], "calibration_sha256": card.export["calibration"]["sha256"]}
    patterns = tuple(recipe["outlier_patterns"])
    qdq = {**recipe, "outlier_min_ratio": 0.0, "rewrites": []}  # the QDQ graph, before the CPU kernel rewrites
    lean = variants.derive(fp32, qdq, calibration=out / CALIBRATION_FILE)
    assert not [n for n in lean.graph.node if n.op_type == "Mul" and FP32_OUTLIERS in n.name]  # no mask left
    # the same split with its masks kept computes the same int8 products: masked channels saturate
    # against all-zero weight rows instead of being multiplied by 0 first
    masked, n = split_outlier_channels(fp32, feeds, patterns, 8, zero_rows=True)
    assert n == 4
    masked = quantize_static_qdq(masked, recipe, feeds)
    assert len([n for n in masked.graph.node if n.op_type == "Mul" and FP32_OUTLIERS in n.name]) == 4
    for x, y in _outputs(lean, masked, feeds[:20]):
        np.testing.assert_array_equal(x, y)
    # a ratio no layer reaches splits nothing; zeroed rows change nothing in fp32
    _, none = split_outlier_channels(fp32, feeds, patterns, 2, min_ratio=1e9)
    assert none == 0
    zeroed, _ = split_outlier_channels(fp32, feeds, patterns, 2, zero_rows=True)
    for x, y in _outputs(fp32, zeroed, feeds[20:30]):
        np.testing.assert_allclose(x, y, atol=1e-5)
    with pytest.raises(variants.VariantError, match="fixed activation scales"):
        variants.derive(
            fp32,
            {**RESEARCH_INT8_PRESETS["dynamic-split"], "outlier_mask": "saturate"},
            calibration=out / CALIBRATION_FILE,
        )


def test_a_partial_split_a_refused_mask_drop_and_an_unknown_mask_mode(exported: onnx_export.ExportResult) -> None:
    from dialogue_safety.core.variants.graphs import (
        activation_ranges,
        quantize_static_qdq,
        saturate_outlier_masks,
        split_outlier_channels,
    )

    _, fp32, feeds = _fp32_and_feeds(exported.out_dir)
    feeds = feeds[:20]
    patterns = (variants.FFN_UP, variants.FFN_DOWN)
    inits = {i.name for i in fp32.graph.initializer}
    inputs = [
        n.input[0]
        for n in fp32.graph.node
        if n.op_type == "MatMul" and n.input[1] in inits and any(re.search(p, n.name) for p in patterns)
    ]
    widest = [np.sort(r)[::-1] for r in activation_ranges(fp32, feeds, sorted(set(inputs))).values()]
    ratios = sorted(float(w[0] / w[2]) for w in widest)  # widest channel against the 3rd (2 channels split)
    assert ratios[0] < ratios[-1]
    between = (ratios[0] + ratios[-1]) / 2  # splits the layers above it only
    _, n = split_outlier_channels(fp32, feeds, patterns, 2, min_ratio=between)
    assert n == sum(r >= between for r in ratios) and 0 < n < len(inputs)
    masked, _ = split_outlier_channels(fp32, feeds, patterns, 2)  # rows not zeroed: the mask must stay
    quantized = quantize_static_qdq(masked, variants.INT8_PRESETS["static"], feeds)
    with pytest.raises(ValueError, match="not zeroed"):
        saturate_outlier_masks(quantized)
    with pytest.raises(variants.VariantError, match="outlier_mask must be one of"):
        variants.derive(fp32, {**variants.INT8_PRESETS["static-split-lean"], "outlier_mask": "saturated"})


def test_a_candidate_that_cannot_be_derived_does_not_stop_the_choice(
    exported: onnx_export.ExportResult, tmp_path: Path
) -> None:
    import shutil

    out = Path(shutil.copytree(exported.out_dir, tmp_path / "model"))
    card = ModelCard.load(out)
    static = {
        "from": "optimized",
        **variants.INT8_PRESETS["static"],
        "calibration_sha256": card.export["calibration"]["sha256"],
    }
    candidates = {"broken": {"from": "fp32", "kind": "no-such-kind"}, "static": static}
    held_out = {"a/valid": _split("a", 30, Split.VALID)}
    record = quantization.select_int8_recipe(out, card, candidates, held_out)
    assert "no-such-kind" in record["candidates"]["broken"]["error"]
    assert "gate" in record["candidates"]["static"]  # judged all the same
    assert record["chosen"] == ("static" if record["passed"] else "broken")
    assert "cannot be derived" in int8_candidate_verdict(record["candidates"]["broken"])


def test_an_export_cpu_without_vnni_keeps_only_portable_candidates(
    exported: onnx_export.ExportResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    out = Path(shutil.copytree(exported.out_dir, tmp_path / "model"))
    card = ModelCard.load(out)
    sha = card.export["calibration"]["sha256"]
    eight = {"from": "fp32", **variants.INT8_PRESETS["static"], "calibration_sha256": sha}
    seven = {**eight, "reduce_range": True}
    held_out = {"a/valid": _split("a", 30, Split.VALID)}
    monkeypatch.setattr(quantization, "cpu_has_vnni", lambda: False)  # its 8-bit products would saturate here
    record = quantization.select_int8_recipe(out, card, {"eight": eight, "seven": seven}, held_out)
    assert record["export_cpu_vnni"] is False
    judged = record["candidates"]
    if judged["eight"]["check"]["band"] is not None and judged["eight"]["batch_dependence"]["steady"]:
        assert judged["eight"]["judged_without_vnni"] and "not kept" in int8_candidate_verdict(judged["eight"])
    assert record["chosen"] == "seven" or not record["passed"]  # never the 8-bit one


def test_static_split_keeps_the_outlier_channels_out_of_the_int8_products(exported: onnx_export.ExportResult) -> None:
    from dialogue_safety.core.variants.graphs import FP32_OUTLIERS

    out = exported.out_dir
    card = ModelCard.load(out)
    recipe = {**RESEARCH_INT8_PRESETS["static-split"], "calibration_sha256": card.export["calibration"]["sha256"]}
    assert variants.needs_calibration(recipe)
    fp32 = onnx.load(str(variants.ensure_variant(out, "fp32", card)))
    graph = variants.derive(fp32, recipe, calibration=out / CALIBRATION_FILE)
    producer = {o: n for n in graph.graph.node for o in n.output}

    def reads_int8(node: onnx.NodeProto) -> bool:
        return node.op_type == "MatMulIntegerToFloat" or any(
            i in producer and producer[i].op_type == "DequantizeLinear" for i in node.input
        )

    apart = [n for n in graph.graph.node if n.op_type == "MatMul" and FP32_OUTLIERS in n.name]
    ffn = [n for n in graph.graph.node if n.op_type in INTEGER_MATMULS and re.search(variants.FFN_DOWN, n.name)]
    assert len(apart) == 4 and not any(reads_int8(n) for n in apart)  # 2 layers x (up, down), in fp32
    assert ffn and all(reads_int8(n) for n in ffn)  # the rest of the product is int8


def test_the_service_counts_the_dialogues_the_int8_check_scored_again() -> None:
    from dialogue_safety.service.state import _counting_int8_checks
    from dialogue_safety.service.telemetry import ServiceMetrics

    class Checked:  # a classifier whose check scores every second dialogue again
        check_band, checked_items, workers, parallel = 0.03, 0, 1, 1
        cancel_token = object

        def row_logits(self, rows: list[EncodedExample], worker: int = 0, cancel: object = None) -> list[str]:
            return ["l"] * len(rows)

        def predict_scored(self, encoded: list[EncodedExample], scored: object) -> list[str]:
            self.checked_items += len(encoded) // 2
            return ["p"] * len(encoded)

    metrics = ServiceMetrics()
    clf = Checked()
    model = _counting_int8_checks(clf, metrics)  # type: ignore[arg-type]
    row = EncodedExample((101, 102), (0, 0), (1, 1))
    assert model.row_logits([row] * 2) == ["l"] * 2
    assert model.predict_scored([row] * 4, None) == ["p"] * 4 and model.predict_scored([row] * 6, None) == ["p"] * 6  # type: ignore[arg-type]
    assert metrics.registry.get_sample_value("safety_int8_checked_items_total") == 5.0
    clf.check_band = 0.0
    assert _counting_int8_checks(clf, metrics) is clf  # type: ignore[arg-type]  # no check: as is


def _ort_graph(model: onnx.ModelProto, tmp_path: Path) -> list[str]:
    """The op types onnxruntime runs for ``model`` on CPU after its own fusions at load."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED  # portable fusions only
    options.optimized_model_filepath = str(tmp_path / "as-run.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "as-run.onnx")).graph.node]


def test_the_cpu_kernel_rewrites_keep_the_function_and_avoid_the_slow_fusions(
    exported: onnx_export.ExportResult, tmp_path: Path
) -> None:
    out = exported.out_dir
    card, fp32, feeds = _fp32_and_feeds(out)
    recipe = {
        **variants.INT8_PRESETS["static-split-lean"],
        "outlier_min_ratio": 0.0,  # the tiny model has no outliers: split every feed-forward input anyway
        "calibration_sha256": card.export["calibration"]["sha256"],
    }
    assert recipe["rewrites"] == list(variants.rewrites.REWRITES)
    rewritten = variants.derive(fp32, recipe, calibration=out / CALIBRATION_FILE)
    qdq = variants.derive(fp32, {**recipe, "rewrites": []}, calibration=out / CALIBRATION_FILE)
    for x, y in _outputs(rewritten, qdq, feeds[:30]):
        np.testing.assert_allclose(x, y, atol=1e-5)  # the same integer products; only float rounding order moves
    ops = [n.op_type for n in rewritten.graph.node]
    assert ops.count("MatMulIntegerToFloat") == 2 * 6 and "DequantizeLinear" not in ops
    integer = [n for n in rewritten.graph.node if n.op_type == "MatMulIntegerToFloat"]
    assert all(len(n.input) == 7 and n.input[6] for n in integer)  # every bias inside, outlier splits included
    as_run, as_run_qdq = _ort_graph(rewritten, tmp_path), _ort_graph(qdq, tmp_path)
    assert "SkipLayerNormalization" in as_run_qdq and "BiasGelu" in as_run_qdq  # what onnxruntime does alone
    assert "SkipLayerNormalization" not in as_run and "BiasGelu" not in as_run
    assert as_run.count("FusedMatMul") == 2 and as_run.count("Gelu") == 2  # K^T by heads; plain GELU per layer
    with pytest.raises(variants.VariantError, match="unknown graph rewrites"):
        variants.derive(fp32, {**recipe, "rewrites": ["fuse_everything"]}, calibration=out / CALIBRATION_FILE)


@pytest.mark.parametrize("scale_shape", [[1], [5]], ids=["one-element", "per-position"])
def test_the_scores_transpose_moves_whole_heads_only_where_that_is_exact(scale_shape: list[int]) -> None:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from dialogue_safety.core.variants.rewrites import scores_transpose

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)  # [batch, heads, positions, head size]
    k = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)  # [batch, positions, heads, head size]
    scale = rng.uniform(0.5, 2, scale_shape).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),  # K^T: [batch, heads, size, positions]
            helper.make_node("Mul", ["kt", "s"], ["kts"]),
            helper.make_node("MatMul", ["q", "kts"], ["scores"], name="scores"),
        ],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in (("q", q), ("k", k))],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(scale, "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    before = model.SerializeToString()
    changed = scores_transpose(model)
    feeds = {"q": q, "k": k}

    def run(m: bytes) -> np.ndarray:
        return ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)[0]

    if scale_shape == [1]:
        assert changed == 1 and [n.op_type for n in model.graph.node] == ["Transpose", "Mul", "FusedMatMul"]
        assert list(model.graph.node[0].attribute[0].ints) == [0, 2, 1, 3]
        np.testing.assert_allclose(run(model.SerializeToString()), run(before), rtol=1e-6, atol=1e-6)
    else:  # a scale per position does not commute with the transpose: left alone
        assert changed == 0 and model.SerializeToString() == before


def _qdq_linear(weight_axis: int = 1, bias_through_identity: bool = False, subgraph_reads: str = "") -> onnx.ModelProto:
    """x -> Q/DQ -> MatMul(DQ(W int8, per-channel along ``weight_axis``)) -> Add(bias), hand-built: 4 x 4 weights.
    ``bias_through_identity``: the bias reaches the Add through an Identity placed after the MatMul (as
    torch.onnx names shared weights); ``subgraph_reads``: an If node whose branch reads that initializer."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    bias = "bias_alias" if bias_through_identity else "bias"
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=weight_axis),
        helper.make_node("MatMul", ["xd", "wd"], ["y"], name="linear"),
        *([helper.make_node("Identity", ["bias"], ["bias_alias"])] if bias_through_identity else []),
        helper.make_node("Add", ["y", bias], ["z"]),
    ]
    outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3, 4])]
    if subgraph_reads:
        branch = helper.make_graph(
            [helper.make_node("Identity", [subgraph_reads], ["picked"])],
            "branch",
            [],
            [helper.make_tensor_value_info("picked", TensorProto.FLOAT, [4])],
        )
        nodes.append(helper.make_node("If", ["flag"], ["chosen"], then_branch=branch, else_branch=branch))
        outputs.append(helper.make_tensor_value_info("chosen", TensorProto.FLOAT, [4]))
    initializers = [
        numpy_helper.from_array(np.array(0.01, np.float32), "xs"),
        numpy_helper.from_array(np.array(128, np.uint8), "xz"),
        # 7-bit weights: the integer kernels are exact on every CPU (8-bit ones saturate on x86 without VNNI)
        numpy_helper.from_array(rng.integers(-64, 65, (4, 4)).astype(np.int8), "wq"),
        numpy_helper.from_array(rng.uniform(0.001, 0.1, 4).astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(4, np.int8), "wz"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "only_in_branch"),
        numpy_helper.from_array(np.array(True), "flag"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "case",
    ["per-column", "per-row scale", "bias through a later Identity", "initializer read in a subgraph"],
)
def test_the_integer_matmul_rewrite_is_exact_or_leaves_the_graph_alone(case: str) -> None:
    import onnxruntime as ort

    from dialogue_safety.core.variants.rewrites import integer_matmul_bias

    model = {
        "per-column": lambda: _qdq_linear(),
        "per-row scale": lambda: _qdq_linear(weight_axis=0),  # a scale per input row: not what the op takes
        "bias through a later Identity": lambda: _qdq_linear(bias_through_identity=True),
        "initializer read in a subgraph": lambda: _qdq_linear(subgraph_reads="only_in_branch"),
    }[case]()
    before = model.SerializeToString()
    changed = integer_matmul_bias(model)
    onnx.checker.check_model(model)  # topologically sorted, every initializer a subgraph reads still there
    x = {"x": np.random.default_rng(2).uniform(-1, 1, (3, 4)).astype(np.float32)}

    def run(m: bytes) -> list[np.ndarray]:
        return ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, x)

    if case == "per-row scale":
        assert changed == 0 and model.SerializeToString() == before
    else:
        assert changed == 1 and "MatMulIntegerToFloat" in [n.op_type for n in model.graph.node]
        for a, b in zip(run(model.SerializeToString()), run(before), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_scores_transpose_does_not_trust_a_stale_shape_annotation() -> None:
    from onnx import TensorProto, helper

    from dialogue_safety.core.variants.rewrites import scores_transpose

    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
            helper.make_node("Identity", ["s_in"], ["s"]),
            helper.make_node("Mul", ["kt", "s"], ["kts"]),
            helper.make_node("MatMul", ["q", "kts"], ["scores"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("q", TensorProto.FLOAT, [2, 3, 5, 4]),
            helper.make_tensor_value_info("k", TensorProto.FLOAT, [2, 5, 3, 4]),
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, ["n"]),  # one scale per position
        ],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)],
        value_info=[helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])],  # a wrong annotation
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert scores_transpose(model) == 0


def _integer_matmul_error(weight_max: int, seed: int = 0) -> float:
    """Max |error| of onnxruntime's MatMulIntegerToFloat on this CPU against exact integer arithmetic, for uint8
    activations over their whole range and int8 weights within ±weight_max (the extremes included)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    k, n = 384, 256
    a = rng.integers(0, 256, size=(64, k)).astype(np.uint8)
    a[0] = 255  # a row of the largest activations against a column of the largest weights
    b = rng.integers(-weight_max, weight_max + 1, size=(k, n)).astype(np.int8)
    b[:, 0] = weight_max
    inits = [
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.array(0.05, np.float32), "a_scale"),
        numpy_helper.from_array(np.full(n, 0.01, np.float32), "b_scale"),
        numpy_helper.from_array(np.array(128, np.uint8), "a_zero"),
    ]
    node = helper.make_node(
        "MatMulIntegerToFloat", ["a", "b", "a_scale", "b_scale", "a_zero"], ["y"], domain=variants.graphs.MS_DOMAIN
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(variants.graphs.MS_DOMAIN, 1)]
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    got = session.run(None, {"a": a})[0]
    exact = ((a.astype(np.int64) - 128) @ b.astype(np.int64)) * 0.05 * 0.01
    return float(np.abs(got - exact).max())


def test_7_bit_integer_products_are_exact_on_this_cpu_and_8_bit_ones_where_the_runtime_serves_them() -> None:
    from dialogue_safety.core.cpu import cpu_has_vnni

    assert _integer_matmul_error(64) < 1e-3  # what a portable (7-bit) recipe relies on, on every CPU
    if cpu_has_vnni() is not False:  # VNNI (or not x86): 8-bit weights are served, so they must be exact here
        assert _integer_matmul_error(127) < 1e-3


def test_the_recorded_outlier_channels_derive_the_same_int8_graph_without_the_ranges_pass(
    exported: onnx_export.ExportResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first start derives int8 from the channels the export recorded in the recipe: the same graph,
    without running the fp32 graph over the calibration rows to find them (core.variants.OUTLIER_CHOICE)."""
    from dialogue_safety.core.variants import graphs

    model = tmp_path / "model"
    shutil.copytree(exported.out_dir, model)
    for derived in model.glob("model.int8.onnx"):
        derived.unlink()
    card = _with_int8_recipe(model, "static-split")  # every FFN layer split (the lean one: where outliers are)
    long_way = variants.ensure_variant(model, "int8", card)
    assert variants.record_outlier_choice(model, "int8", card)
    chosen = card.export["recipes"]["int8"][variants.OUTLIER_CHOICE]
    assert chosen and all(len(idx) == 8 for idx in chosen.values())
    card.save(model)
    assert variants.derived_path(model, "int8", card) == long_way  # re-stamped: no second derivation
    before = onnx.load(str(long_way))

    def no_ranges_pass(*_: Any, **__: Any) -> None:
        raise AssertionError("the recorded channels were not used")

    monkeypatch.setattr(graphs, "activation_ranges", no_ranges_pass)
    again = variants.ensure_variant(model, "int8", ModelCard.load(model), force=True)
    after = onnx.load(str(again))
    assert [(n.op_type, list(n.input)) for n in after.graph.node] == [
        (n.op_type, list(n.input)) for n in before.graph.node
    ]
    for a, b in zip(before.graph.initializer, after.graph.initializer, strict=True):
        assert a.name == b.name and a.raw_data == b.raw_data, a.name
    wrong = {**card.export["recipes"]["int8"], variants.OUTLIER_CHOICE: {"/not/a/node/MatMul": [0]}}
    _, fp32, feeds = _fp32_and_feeds(model)
    with pytest.raises(variants.VariantError, match="does not split"):
        variants.derive(fp32, wrong, calibration=model / CALIBRATION_FILE)
