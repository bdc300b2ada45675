"""Only the tests marked ``browser`` and ``postgres`` need Debian packages (Chromium, PostgreSQL), and
scripts/test.sh says what it installs before it installs anything, without asking."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEEDS = {"browser": ("chromium_path",), "postgres": ("postgres_bindir", "postgres_url")}


def test_every_test_module_that_needs_a_system_package_is_marked() -> None:
    for path in sorted((REPO / "tests").glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text(encoding="utf-8")
        for mark, names in NEEDS.items():
            uses = any(re.search(rf"\b{name}\b", text) for name in names)
            marked = f"pytestmark = pytest.mark.{mark}" in text
            assert uses == marked, (
                f"{path.name}: uses {mark} fixtures {names} but is not marked `{mark}` (or the reverse)"
            )


def test_test_sh_says_what_it_installs_before_it_installs_and_never_asks() -> None:
    script = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    plan, _, work = script.partition("# -- then the work")
    assert work, "scripts/test.sh has a plan part and a work part"
    assert "apt-get install -y" not in plan and "$(scripts/env.sh dev" not in plan and "apt-get update -q" not in plan
    assert "Python environment:" in plan and "Debian packages:" in plan and "apt-get -s" in plan
    assert "apt-get install -y" in work and "DEBIAN_FRONTEND=noninteractive" in script
    assert "sudo " not in work and not re.search(r"^\s*read\b|\|\s*read\b", script, re.M)
