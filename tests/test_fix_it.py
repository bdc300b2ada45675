"""fix-it's parts that need no training: the merged data directory, the recipe it trains, the report.
(The whole fix-it run, on the tiny recipe, is in the browser test.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from dialogue_safety.cli.fix_it import fix_it_recipe, markdown_report, merged_data_dir
from dialogue_safety.sources.registry import load_source
from dialogue_safety.training.recipe import load_recipe

FULL = Path(__file__).parent / "fixtures" / "sources" / "full"


def test_merged_data_dir_links_sources_and_rounds(tmp_path: Path) -> None:
    rounds = tmp_path / "exports"
    (rounds / "breakit").mkdir(parents=True)
    (rounds / "breakit" / "round-1").symlink_to((FULL / "breakit" / "round-1").resolve())
    merged = merged_data_dir(FULL, rounds, 1, tmp_path / "data")
    assert (merged / "diasafety").resolve() == (FULL / "diasafety").resolve()
    assert len(load_source("breakit", merged)) == len(load_source("breakit", FULL))
    with pytest.raises(FileNotFoundError, match="break-it export --round 2"):
        merged_data_dir(FULL, rounds, 2, tmp_path / "data2")


def test_fix_it_recipe_adds_the_rounds_upsampling_later_ones() -> None:
    recipe = fix_it_recipe(load_recipe("tiny"), [1, 2, 3], 3)
    spec = recipe.tasks[-1]
    assert spec.source == "breakit" and spec.rounds == ("1", "2", "3") and spec.required
    assert spec.round_weights == {"1": 1.0, "2": 2.0, "3": 3.0}
    assert recipe.version.endswith("+r3") and [t.source for t in recipe.tasks].count("breakit") == 1


def test_markdown_report_has_the_models_by_rounds_matrix() -> None:
    cell = {"n": 4, "error_rate": 25.0, "offensive_f1": 66.7}
    empty = {"n": 0, "error_rate": None, "offensive_f1": None}
    report = {
        "round": 2, "model": "m@1+r2", "rounds": [1, 2], "test_sizes": {"1": 4, "2": 0},
        "matrix": {"A0": {"1": cell, "2": empty}, "A2": {"1": cell, "2": cell}},
        "game": {"1": {"model": "m@1", "tries": 10, "fooled": 4, "attack_success_rate": 40.0}},
        "standard_test": {"A0": {"olid": 70.0}, "A2": {"olid": 71.5}},
        "recipe": "tiny", "data_dir": "/d", "command": "dialogue-safety fix-it --round 2",
    }  # fmt: skip
    md = markdown_report(report)
    assert "| model | round 1 (n=4) | round 2 (n=0) |" in md
    assert "| A0 | 25.0 | – |" in md and "| A2 | 66.7 | 66.7 |" in md
    assert "| 1 | m@1 | 10 | 4 | 40.0 |" in md and "| A2 | 71.5 |" in md
