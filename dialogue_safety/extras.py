"""Which optional extra a command needs, and a one-line instruction when it is not installed.

The extras themselves are defined once, in ``pyproject.toml``; this module reads them back from
the installed package's metadata (``importlib.metadata``), so the check cannot drift from them.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution, requires

PACKAGE = "dialogue-safety"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*['"]([A-Za-z0-9._-]+)['"]""")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SELF_EXTRAS = re.compile(r"\[([^\]]*)\]")


def extra_requirements(extra: str) -> list[str] | None:
    """Distribution names the extra pulls in (self-references expanded), or None when unknowable.

    None means the package metadata is not there (code run from a checkout without installing it)
    or the installed package does not define ``extra``.
    """
    try:
        reqs = requires(PACKAGE) or []
    except PackageNotFoundError:
        return None
    by_extra: dict[str, list[str]] = {}
    for req in reqs:
        requirement, _, marker = req.partition(";")
        match = _EXTRA_MARKER.search(marker)
        if match:
            by_extra.setdefault(match.group(1), []).append(requirement.strip())
    if extra not in by_extra:
        return None
    names: list[str] = []
    pending, seen = [extra], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for requirement in by_extra.get(current, []):
            name_match = _NAME.match(requirement)
            if name_match is None:
                continue
            name = name_match.group(0)
            if _normalise(name) == _normalise(PACKAGE):
                inner = _SELF_EXTRAS.search(requirement)
                pending += [e.strip() for e in inner.group(1).split(",")] if inner else []
            elif name not in names:
                names.append(name)
    return names


def missing_distributions(extra: str) -> list[str]:
    """The extra's distributions that are not installed (empty when all are, or when unknowable)."""
    missing = []
    for name in extra_requirements(extra) or []:
        try:
            distribution(name)
        except PackageNotFoundError:
            missing.append(name)
    return missing


#: import names that differ from their distribution's name
_DISTRIBUTION_OF = {"sklearn": "scikit-learn", "optimum": "optimum-onnx", "yaml": "pyyaml"}
#: the extras in the order a missing module is attributed to them (the smallest install first); every
#: extra of pyproject.toml is here, so that a missing module is never attributed to an extra without it
EXTRA_ORDER: tuple[str, ...] = ("serve", "breakit", "scale", "evaluate", "train", "dev")


def extra_providing(module: str) -> str | None:
    """The first extra (in :data:`EXTRA_ORDER`) that installs the top-level ``module``, if any does."""
    wanted = _normalise(_DISTRIBUTION_OF.get(module, module))
    for extra in EXTRA_ORDER:
        if any(_normalise(name) == wanted for name in extra_requirements(extra) or []):
            return extra
    return None


#: the scripts/env.sh job whose environment holds an extra, where the names differ
ENV_JOB = {"scale": "score"}


def install_hint(extra: str) -> str:
    """How to install ``extra``: the setup script in a checkout, or pip."""
    job = ENV_JOB.get(extra, extra)
    return f"install it with: scripts/env.sh {job} (in a checkout), or pip install '{PACKAGE}[{extra}]'"


def missing_extra_message(prog: str, extra: str, missing: list[str]) -> str:
    """The one line printed instead of an ImportError traceback."""
    return f"{prog}: needs the '{extra}' extra (not installed: {', '.join(missing)}); {install_hint(extra)}"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
