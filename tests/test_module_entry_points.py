"""Every ``python -m`` entry point starts (``--help``), and the runtime benchmark runs as a module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__main__")
    for package in ("dialogue_safety", "lab")
    for path in (ROOT / package).rglob("*.py")
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)


def test_the_entry_points_are_found() -> None:
    assert {
        "dialogue_safety.cli.main",
        "lab.bench",
        "lab.bench.runtime_speed",
        "lab.experiments.soup",
        "dialogue_safety.core.variants",
    } <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_python_m_help(module: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage" in run.stdout.lower()


def test_python_m_benchmarks_runtime_smoke() -> None:
    # the __main__ guard once stood above a function main() calls (NameError): run it as a module
    run = subprocess.run(
        [sys.executable, "-m", "lab.bench.runtime_speed", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "| engine |" in run.stdout
