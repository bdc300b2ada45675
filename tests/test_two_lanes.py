"""The two-lanes experiment runs end to end on the tiny model: every case measured, JSON written."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
from pathlib import Path

from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from lab.experiments.two_lanes import main


def test_every_case_is_measured(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "lanes.json"
    main(["--model", str(tiny_model_dir), "--seconds", "0.3", "--json", str(out)])
    report = json.loads(out.read_text())
    assert set(report) == {
        "quiet",
        "quiet, one thread",
        "long alone (served threads)",
        "long alone (one thread)",
        "one lane (served threads)",
        "two lanes (one thread each)",
    }
    for name, case in report.items():
        if name.startswith("long alone"):
            assert case["n"] == 0 and case["long_tokens_per_s"] > 0
        else:
            assert case["n"] > 0 and case["p99_ms"] >= case["p50_ms"] > 0
    assert report["quiet"]["p99_x_quiet"] == 1.0
    assert report["two lanes (one thread each)"]["long_tokens_per_s"] > 0
