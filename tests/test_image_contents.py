"""The image holds what the package promises: every module that ``dialogue_safety.__all__`` needs (and the
service's app) passes ``.dockerignore``.

``.dockerignore`` lets in an allow-list. A module the public API imports (at the top, inside a function, or
lazily through the package's ``__getattr__``, as ``Client`` is) and that the list forgets is missing
from the image: ``dialogue_safety.Client`` then raises ModuleNotFoundError there. No Docker daemon is needed:
the file is read with Docker's rules (last matching line wins, ``!`` lets a path back in, a pattern
that matches a folder matches everything in it, ``*`` stays within one path segment, ``**`` spans any).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_import_layers import GRAPH, PACKAGE  # the one reader of the package's imports

import dialogue_safety

REPO = Path(__file__).resolve().parents[1]
DOCKERIGNORE = REPO / ".dockerignore"
#: where the image starts from: the public API and the app that `dialogue-safety serve` runs
ROOTS = (PACKAGE, f"{PACKAGE}.service.app")


def _pattern(glob: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over a slash-separated path relative to the context."""
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out)


def dockerignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(lets in, pattern) per line, in order (comments and blank lines skipped)."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        glob = line.removeprefix("!").strip().strip("/")
        rules.append((keep, _pattern(glob)))
    return rules


def is_shipped(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether ``path`` (relative, with slashes) reaches the image's build context."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]  # the path and the folders above it
    shipped = True
    for keep, pattern in rules:
        if any(pattern.fullmatch(c) for c in candidates):
            shipped = keep
    return shipped


def needed_modules(roots: tuple[str, ...] = ROOTS) -> set[str]:
    """Every module of the package the roots import, directly or not, with the packages above each."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parents = [".".join(module.split(".")[:n]) for n in range(1, module.count(".") + 1)]
        todo += [*GRAPH.get(module, ()), *parents]
    return seen


def module_file(module: str) -> str:
    as_path = Path(*module.split("."))
    return (as_path / "__init__.py" if (REPO / as_path).is_dir() else as_path.with_suffix(".py")).as_posix()


def test_the_reader_follows_dockers_rules() -> None:
    rules = dockerignore_rules("# everything out, some back\n*\n!pkg/core/\n!pkg/a.py\n**/__pycache__\n!README.md\n")
    assert is_shipped("pkg/core/x.py", rules) and is_shipped("pkg/core/sub/y.py", rules)
    assert is_shipped("pkg/a.py", rules) and is_shipped("README.md", rules)
    assert not is_shipped("pkg/client.py", rules), "a file of a folder that `*` leaves out stays out"
    assert not is_shipped("pkg/core/__pycache__/x.pyc", rules) and not is_shipped("setup.py", rules)
    assert is_shipped("anything", dockerignore_rules("")), "without rules everything is sent"


def test_every_public_name_comes_from_a_module_the_walk_finds() -> None:
    """The walk is not vacuous: each name of ``__all__`` is defined in a module it reaches."""
    needed = needed_modules()
    for name in dialogue_safety.__all__:
        defined_in = getattr(dialogue_safety, name).__module__
        assert defined_in in needed, f"{name} comes from {defined_in}, which the import walk does not reach"
    assert f"{PACKAGE}.client" in needed and f"{PACKAGE}.core.runtime" in needed


@pytest.mark.parametrize("module", sorted(needed_modules()))
def test_every_module_the_public_api_and_the_service_need_is_in_the_image(module: str) -> None:
    path = module_file(module)
    assert (REPO / path).is_file(), path
    assert is_shipped(path, dockerignore_rules(DOCKERIGNORE.read_text(encoding="utf-8"))), (
        f"{path} is needed by {' or '.join(ROOTS)} but .dockerignore leaves it out of the image: add `!{path}`"
    )


def test_the_bundled_model_files_are_in_the_image_and_derived_variants_are_not() -> None:
    from dialogue_safety.core.model_dir import ARTIFACT_FILE, CARD_FILE, TOKENIZER_FILE

    rules = dockerignore_rules(DOCKERIGNORE.read_text(encoding="utf-8"))
    for name in (ARTIFACT_FILE, CARD_FILE, TOKENIZER_FILE):
        assert is_shipped(f"models/default/{name}", rules), name
    assert not is_shipped("models/default/model.int8.onnx", rules)
    assert not is_shipped("dialogue_safety/__pycache__/x.cpython-311.pyc", rules)
