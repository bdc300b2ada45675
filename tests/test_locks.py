"""The locks (constraints/JOB.txt) agree with pyproject.toml, with each other and with the installers.

scripts/lock.sh writes them; scripts/env.sh (so scripts/serve.sh, scripts/test.sh, .ci/run) and the
Dockerfile install with them. A dependency changed in pyproject.toml without running scripts/lock.sh
fails here, naming the command to run.
"""

import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
JOBS = ("serve", "evaluate", "score", "train", "dev")
# the platform the locks are resolved for (scripts/lock.sh): markers are evaluated there
LOCK_PLATFORM = {
    **default_environment(),
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "python_version": "3.11",
    "python_full_version": "3.11.7",
}


def _digest() -> str:
    spec = importlib.util.spec_from_file_location("lock_digest", ROOT / "scripts" / "lock_digest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dependency_digest(ROOT / "pyproject.toml")


def _read_lock(job: str) -> tuple[str, dict[str, Version]]:
    path = ROOT / "constraints" / f"{job}.txt"
    assert path.is_file(), f"{path} is missing: run scripts/lock.sh"
    digest, pins = "", {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if m := re.match(r"# pyproject\.toml dependencies digest: (\w+)", line):
            digest = m.group(1)
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        spec = list(req.specifier)
        assert len(spec) == 1 and spec[0].operator == "==", f"{path.name}:{number}: not a pin: {line!r}"
        if req.marker is None or req.marker.evaluate(LOCK_PLATFORM):
            pins[canonicalize_name(req.name)] = Version(spec[0].version)
    return digest, pins


def _extras(job: str) -> list[str]:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "env.sh"), "extras", job], capture_output=True, text=True, check=True
    )
    return out.stdout.strip().split(",")


def _requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    optional = project["optional-dependencies"]
    reqs, todo, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for raw in optional[extra]:
            req = Requirement(raw)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                todo.extend(req.extras)  # dialogue-safety[serve] inside another extra
            else:
                reqs.append(req)
    return [r for r in reqs if r.marker is None or r.marker.evaluate(LOCK_PLATFORM)]


def _torch_version() -> Version:
    text = (ROOT / "scripts" / "env.sh").read_text(encoding="utf-8")
    m = re.search(r'^TORCH_VERSION="([^"]+)"', text, re.M)
    assert m, "scripts/env.sh no longer sets TORCH_VERSION"
    return Version(m.group(1))


@pytest.mark.parametrize("job", JOBS)
def test_lock_was_written_from_this_pyproject(job):
    digest, _ = _read_lock(job)
    assert digest == _digest(), (
        f"constraints/{job}.txt was resolved from another pyproject.toml (digest {digest or 'none'}, "
        f"now {_digest()}): run scripts/lock.sh and commit constraints/"
    )


@pytest.mark.parametrize("job", JOBS)
def test_lock_pins_every_requirement_of_the_job_within_its_range(job):
    _, pins = _read_lock(job)
    problems = []
    for req in _requirements(_extras(job)):
        name = canonicalize_name(req.name)
        version = _torch_version() if name == "torch" else pins.get(name)
        if version is None:
            problems.append(f"{req.name} is not pinned")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}=={version} is outside {req}")
    assert not problems, f"constraints/{job}.txt: " + "; ".join(problems) + " (run scripts/lock.sh)"


def test_every_job_locks_the_same_versions():
    _, dev = _read_lock("dev")
    for job in JOBS:
        _, pins = _read_lock(job)
        differ = {name: (str(v), str(dev.get(name))) for name, v in pins.items() if dev.get(name) != v}
        assert not differ, f"constraints/{job}.txt disagrees with constraints/dev.txt: {differ}"


def test_uvicorn_is_pinned_to_the_tested_minor_version():
    """server.py relies on uvicorn internals: pyproject.toml allows one minor release, and the lock is in it."""
    serve = [r for r in _requirements(["serve"]) if canonicalize_name(r.name) == "uvicorn"]
    assert serve, "the serve extra no longer names uvicorn"
    spec = serve[0].specifier
    _, pins = _read_lock("serve")
    minor = pins["uvicorn"].release[:2]
    assert spec.contains(pins["uvicorn"]), f"locked uvicorn {pins['uvicorn']} outside {spec}"
    next_minor = Version(f"{minor[0]}.{minor[1] + 1}.0")
    assert not spec.contains(next_minor), f"pyproject.toml allows uvicorn {next_minor} ({spec}): pin the minor version"


def test_installers_use_the_locks():
    env_sh = (ROOT / "scripts" / "env.sh").read_text(encoding="utf-8")
    assert 'lock="$REPO/constraints/${lock_job:-$job}.txt"' in env_sh and '-c "$lock"' in env_sh
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"pip install[^\n]*-c constraints/serve\.txt", dockerfile), "the Dockerfile ignores the lock"
    assert "constraints/serve.txt" in (ROOT / ".dockerignore").read_text(encoding="utf-8")
