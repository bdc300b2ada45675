"""Every "install X" hint names a command that installs X: each hint's extra (pyproject.toml) holds the module
it names, every extra's hint names a scripts/env.sh job that installs that extra, and a missing module is
attributed to an extra that has it. The break-it game serves from the documented command (scripts/serve.sh
installs its extra when SAFETY_BREAKIT_DB is set)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from dialogue_safety import extras

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dialogue_safety"
HINT = re.compile(r"pip install 'dialogue-safety\[(\w+)\]'|install_hint\('(\w+)'\)")
#: every file with an install hint, and the distribution its hint is about (a new hint must be added here)
HINTS: dict[str, set[str]] = {
    "dialogue_safety/corpus/formats.py": {"pyarrow"},
    "dialogue_safety/corpus/ray_engine.py": {"ray"},
    "dialogue_safety/evaluation/evaluate.py": {"torch"},
    "dialogue_safety/core/runtime.py": {"onnx"},
    "dialogue_safety/core/variants/graphs.py": {"onnx-ir"},
    "dialogue_safety/core/language.py": {"py3langid"},
    "dialogue_safety/core/policy.py": {"google-re2"},
    "dialogue_safety/breakit/api.py": {"sqlalchemy", "alembic", "limits"},
    "lab/bench/score.py": {"ray"},
    "lab/experiments/ablation.py": {"torch"},
}


def pyproject_extras() -> dict[str, set[str]]:
    """{extra: distribution names it installs}, self-references (dialogue-safety[serve]) expanded."""
    raw = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]

    def names(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for req in raw[extra]:
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
            assert name
            if name.group(0) == "dialogue-safety":
                inner = re.search(r"\[([^\]]*)\]", req)
                for e in inner.group(1).split(",") if inner else []:
                    if e.strip() not in seen:
                        out |= names(e.strip(), seen | {extra})
            else:
                out.add(name.group(0).lower())
        return out

    return {extra: names(extra) for extra in raw}


def hinted_extras(text: str) -> set[str]:
    return {a or b for a, b in HINT.findall(text)}


def test_every_hint_names_an_extra_that_installs_what_it_is_about() -> None:
    found = {
        str(path.relative_to(REPO)): hinted_extras(path.read_text(encoding="utf-8"))
        for root in (PACKAGE, REPO / "lab")
        for path in root.rglob("*.py")
        if path.name != "extras.py" and hinted_extras(path.read_text(encoding="utf-8"))
    }
    assert set(found) == set(HINTS), "an install hint was added or removed: list it in HINTS with what it is about"
    have = pyproject_extras()
    for file, hinted in found.items():
        for extra in hinted:
            assert extra in have, f"{file}: names the extra {extra!r}, which pyproject.toml does not define"
            lacking = HINTS[file] - have[extra]
            assert not lacking, f"{file}: the {extra!r} extra does not install {lacking}"


@pytest.mark.parametrize("extra", sorted(pyproject_extras()))
def test_each_extras_hint_names_an_env_job_that_installs_it(extra: str) -> None:
    hint = extras.install_hint(extra)
    job = re.search(r"scripts/env\.sh (\w+)", hint)
    assert job and f"pip install 'dialogue-safety[{extra}]'" in hint, hint
    installed = subprocess.run(
        ["bash", str(REPO / "scripts" / "env.sh"), "extras", job.group(1)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert extra in installed.split(","), f"{hint!r}: scripts/env.sh {job.group(1)} installs {installed}, not {extra}"


def test_a_missing_module_is_attributed_to_an_extra_that_installs_it() -> None:
    have = pyproject_extras()
    assert set(have) <= set(extras.EXTRA_ORDER), "every extra can be named by a hint"
    assert extras.extra_providing("limits") == "breakit"  # the break-it game's rate limits, not 'serve'
    for names in have.values():
        for name in names:
            provider = extras.extra_providing(name)
            assert provider is not None and name in have[provider], (name, provider)


def test_serve_sh_installs_the_breakit_extra_when_the_game_is_on(tmp_path: Path) -> None:
    """scripts/serve.sh with a stand-in env.sh (which records the job) and a stand-in command."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    shutil.copy(REPO / "scripts" / "serve.sh", scripts / "serve.sh")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (scripts / "env.sh").write_text(f'#!/usr/bin/env bash\necho "$1" >> {tmp_path}/jobs\necho {venv}\n')
    (venv / "bin" / "dialogue-safety").write_text('#!/usr/bin/env bash\necho served "$@"\n')
    for f in (scripts / "env.sh", venv / "bin" / "dialogue-safety"):
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in {"SAFETY_BREAKIT_DB", "VIRTUAL_ENV"}}

    def serve(*args: str, **extra_env: str) -> str:
        out = subprocess.run(
            ["bash", str(scripts / "serve.sh"), *args], env={**env, **extra_env}, capture_output=True, text=True
        )
        assert out.returncode == 0 and out.stdout.startswith("served"), out.stderr
        return (tmp_path / "jobs").read_text().split()[-1]

    assert serve() == "serve"
    assert serve(SAFETY_BREAKIT_DB="runs/breakit.sqlite3") == "breakit"
    assert serve("--breakit-db", "runs/breakit.sqlite3") == "breakit"
    assert serve("--breakit-db=runs/breakit.sqlite3") == "breakit"
    env_sh = (REPO / "scripts" / "env.sh").read_text(encoding="utf-8")
    assert re.search(r'breakit\)\s+default_venv=\.venv;\s+extras="serve,breakit"', env_sh)
