"""The quickstart's environment (the `serve` extra alone) is enough to serve and to score JSONL/CSV.

CI tests in `.venv-dev`, where every extra is installed, so an import of another extra's package on
the serving path (the break-it game's rate-limit library, say) would pass every other test and break
`scripts/serve.sh` on a fresh machine. Here a subprocess hides every distribution that only the other
extras bring, then builds the app, imports the commands and classifies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def _closure(names: list[tuple[str, set[str]]]) -> set[str]:
    """Every installed distribution these (name, extras) pull in, following their own requirements."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name, wanted = todo.pop()
        key = canonicalize_name(name)
        if key in seen:
            continue
        seen.add(key)
        try:
            reqs = distribution(name).requires or []
        except PackageNotFoundError:
            continue
        for raw in reqs:
            req = Requirement(raw)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted | {""}):
                todo.append((req.name, set(req.extras)))
    return seen


def _hidden_modules() -> list[str]:
    declared = [Requirement(r) for r in requires("dialogue-safety") or []]
    serving = [(r.name, set(r.extras)) for r in declared if r.marker is None or r.marker.evaluate({"extra": "serve"})]
    allowed = _closure(serving)
    others = {canonicalize_name(r.name) for r in declared} - allowed - {"dialogue-safety"}
    return sorted(
        module
        for module, dists in packages_distributions().items()
        if dists and all(canonicalize_name(d) in others for d in dists)
    )


def test_the_serve_extra_alone_serves_and_scores() -> None:
    hidden = _hidden_modules()
    assert {"torch", "sqlalchemy", "limits", "ray"} <= set(hidden), hidden  # the check hides what it should
    code = f"""
import importlib.abc, sys
HIDDEN = set({hidden!r})
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Hide())
import dialogue_safety
from dialogue_safety.cli.main import main
import dialogue_safety.cli.score, dialogue_safety.corpus.job, dialogue_safety.corpus.formats
from dialogue_safety.service.app import create_app
from dialogue_safety.service.settings import ServiceSettings
create_app(ServiceSettings())
assert dialogue_safety.classify("have a nice day").label.value == "SAFE"
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")
