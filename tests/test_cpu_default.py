"""The CPU default chosen per CPU family: the family read from /proc/cpuinfo (core/cpu.py), the figures the
card records per family, the variants that pass the gate, and what the runtime, the export, the card's
markdown, the variants CLI and the lab's --record-card make of them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core import cpu
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.runtime import OnnxClassifier, cpu_default, cpu_defaults, fastest_recorded
from dialogue_safety.core.variants import INT8_PRESETS
from dialogue_safety.core.variants import cli as variants_cli

ZEN3 = "processor : 0\nflags : fpu sse avx avx2 fma\n"  # AVX2, no AVX-512, no VNNI
ZEN4 = "processor : 0\nflags : fpu avx2 avx512f avx512bw avx512_vnni\n"
SKYLAKE_X = "processor : 0\nflags : fpu avx2 avx512f avx512bw\n"  # AVX-512 without VNNI
ALDER_LAKE = "processor : 0\nflags : fpu avx2 avx_vnni\n"  # AVX-VNNI without AVX-512
ARM = "processor : 0\nFeatures : fp asimd asimddp\n"
SEVEN_BIT = {**INT8_PRESETS["static-split-lean-7bit"], "from": "fp32"}
EIGHT_BIT = {**INT8_PRESETS["static-split-lean"], "from": "fp32"}


def test_the_cpu_family_from_the_flags() -> None:
    assert cpu.cpu_family(ZEN3) == cpu.AVX2
    assert cpu.cpu_family(ZEN4) == cpu.AVX512_VNNI
    assert cpu.cpu_family(SKYLAKE_X) is None and cpu.cpu_family(ALDER_LAKE) is None  # nothing measured for them
    assert cpu.cpu_family(ARM) is None and cpu.cpu_flags(ARM) is None
    assert (cpu.cpu_has_vnni(ZEN3), cpu.cpu_has_vnni(ZEN4), cpu.cpu_has_vnni(ALDER_LAKE), cpu.cpu_has_vnni(ARM)) == (
        False,
        True,
        True,
        None,
    )
    assert cpu.cpu_family() in (*cpu.CPU_FAMILIES, None)  # this machine's, whatever it is


def _card(int8_recipe: dict[str, Any], speed: dict[str, dict[str, float]], candidates: list[str]) -> ModelCard:
    figures = {
        family: {"variants": {v: {"dialogues_per_s": x} for v, x in per_variant.items()}, "measured": "test"}
        for family, per_variant in speed.items()
    }
    return ModelCard(
        cpu_variant="int8",
        cpu_candidates=candidates,
        cpu_speed=figures,
        export={"recipes": {"int8": int8_recipe}, "comparison": {"seconds": {"fp32": 2.0, "optimized": 3.0}}},
    )


def test_the_runtime_serves_the_fastest_passing_variant_recorded_for_its_family() -> None:
    speed = {cpu.AVX2: {"fp32": 120.0, "optimized": 110.0, "int8": 100.0}, cpu.AVX512_VNNI: {"fp32": 250, "int8": 600}}
    card = _card(SEVEN_BIT, speed, ["fp32", "optimized", "int8"])
    assert cpu_default(card, ZEN3)[0] == "fp32" and "avx2" in cpu_default(card, ZEN3)[1]
    assert cpu_default(card, ZEN4)[0] == "int8"
    # a family without figures: the card's choice (the export machine's)
    assert cpu_default(card, SKYLAKE_X) == ("int8", "a CPU family with no recorded figures: the card's CPU default")
    # only the variants that pass the gate are served, however fast
    assert cpu_default(_card(SEVEN_BIT, speed, ["optimized", "int8"]), ZEN3)[0] == "optimized"
    assert fastest_recorded(card, cpu.AVX2, ["int8"]) == "int8" and fastest_recorded(card, "sse2") is None
    # a card written before the candidates: its cpu_variant, as before
    assert cpu_default(_card(SEVEN_BIT, speed, []), ZEN3)[0] == "int8"


def test_an_8_bit_int8_is_never_picked_where_it_saturates() -> None:
    speed = {cpu.AVX2: {"fp32": 100.0, "optimized": 90.0, "int8": 300.0}, cpu.AVX512_VNNI: {"fp32": 100, "int8": 300}}
    card = _card(EIGHT_BIT, speed, ["fp32", "optimized", "int8"])
    assert cpu_default(card, ZEN3)[0] == "fp32"  # int8 is the fastest recorded, but its products saturate here
    assert cpu_default(card, ZEN4)[0] == "int8"
    unmeasured = _card(EIGHT_BIT, {}, ["fp32", "optimized", "int8"])
    variant, why = cpu_default(unmeasured, ZEN3)  # the exact fallback of before: the faster in the export
    assert variant == "fp32" and "VNNI" in why
    assert set(cpu_defaults(card)) == {"int8", "fp32"}  # what an image for any CPU keeps


def test_an_image_keeps_every_variant_the_runtime_may_pick(tiny_model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    work = tmp_path / "model"
    shutil.copytree(tiny_model_dir, work)
    card = ModelCard.load(work)
    card.cpu_variant, card.cpu_candidates = "fp32", ["fp32", "optimized"]
    card.cpu_speed = {cpu.AVX2: {"variants": {"fp32": {"dialogues_per_s": 1.0}, "optimized": {"dialogues_per_s": 2}}}}
    card.save(work)
    assert cpu_defaults(card) == ["fp32", "optimized"]
    assert variants_cli.main([str(work), "cpu", "--prune"]) == 0
    assert (work / "model.optimized.onnx").is_file()


def test_the_classifier_loads_the_variant_recorded_fastest_here(tiny_model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    work = tmp_path / "model"
    shutil.copytree(tiny_model_dir, work)
    card = ModelCard.load(work)
    assert card.cpu_candidates == ["fp32"] and card.cpu_variant == "fp32"  # the export recorded what passed
    card.cpu_candidates = ["fp32", "optimized"]
    figures = {"variants": {"fp32": {"dialogues_per_s": 1.0}, "optimized": {"dialogues_per_s": 2.0}}}
    card.cpu_speed = {family: figures for family in cpu.CPU_FAMILIES}
    card.save(work)
    expected = "optimized" if cpu.cpu_family() is not None else "fp32"  # another CPU: the card's cpu_variant
    assert OnnxClassifier(work).variant == expected
    assert OnnxClassifier(work, variant="fp32").variant == "fp32"  # asked for: served as asked


def test_the_export_records_the_passing_variants_and_its_figures() -> None:
    from dialogue_safety.export.comparison import passing_variants, speed_figures

    report = {
        "splits": {"a": {"n": 600}, "b": {"n": 400}},
        "seconds": {"fp32": 4.0, "optimized": 5.0, "int8": 2.0},
        "gate": {"optimized": {"passed": True}, "int8": {"passed": False}},
    }
    assert passing_variants(report, ["fp32", "optimized", "int8"]) == ["fp32", "optimized"]
    assert passing_variants(None, ["fp32", "optimized", "int8"]) == ["optimized"]
    assert speed_figures(report, ["fp32", "int8"]) == {
        "fp32": {"dialogues_per_s": 250.0},
        "int8": {"dialogues_per_s": 500.0},
    }
    assert speed_figures(None, ["fp32"]) == {}


def test_the_card_says_what_each_family_is_served() -> None:
    from dialogue_safety.export.card_markdown import _cpu_families

    speed = {cpu.AVX2: {"fp32": 120.0, "int8": 100.0}, cpu.AVX512_VNNI: {"fp32": 250, "int8": 600}}
    lines = _cpu_families(_card(SEVEN_BIT, speed, ["fp32", "int8"]))
    assert lines[0].endswith("fp32, int8")
    assert lines[1].startswith("- on avx2: **fp32**") and lines[2].startswith("- on avx512_vnni: **int8**")
    assert _cpu_families(ModelCard()) == []


def test_the_shipped_card_records_both_families() -> None:
    card = ModelCard.load(Path(__file__).resolve().parents[1] / "models" / "default")
    assert set(card.cpu_speed) == set(cpu.CPU_FAMILIES)
    assert card.cpu_variant in card.cpu_candidates and "fp32" in card.cpu_candidates
    for family in cpu.CPU_FAMILIES:
        assert fastest_recorded(card, family) in card.cpu_candidates


@pytest.mark.parametrize("family", [cpu.AVX2, None])
def test_the_lab_records_a_runs_figures_under_its_family(
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    family: str | None,
) -> None:
    from lab.bench.runtime_speed import record_card

    work = tmp_path / "model"
    shutil.copytree(tiny_model_dir, work)

    def engine(name: str, variant: str, per_s: float) -> dict[str, Any]:
        return {
            "engine": name,
            "variant": variant,
            "single": {"p50_ms": 3.0},
            "sorted64": {"examples_per_s": per_s},
            "token_budget": {"examples_per_s": per_s + 1},
        }

    report = {
        "smoke": False,
        "cpu_family": family,
        "threads": 2,
        "machine": {"cpu": "test CPU", "load_average_at_start": [0.1], "load_average_at_end": [0.2]},
        "engines": [
            engine("naive-fp32", "naive-fp32", 50.0),
            engine("onnxruntime fp32", "fp32", 10.0),
            engine("onnxruntime int8", "int8", 20.0),
            engine("onnxruntime int8 unchecked", "int8", 99.0),
        ],
    }
    recorded = record_card(work, report, "--examples 3")
    card = ModelCard.load(work)
    if family is None:
        assert recorded is None and card.cpu_speed == ModelCard.load(tiny_model_dir).cpu_speed
        return
    assert recorded is not None and card.cpu_speed[family]["variants"] == {
        "fp32": {"dialogues_per_s": 11.0, "single_p50_ms": 3.0},
        "int8": {"dialogues_per_s": 21.0, "single_p50_ms": 3.0},
    }
    assert "--examples 3" in card.cpu_speed[family]["measured"]
    assert "on avx2" in (work / "MODEL_CARD.md").read_text(encoding="utf-8")
