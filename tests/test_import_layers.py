"""The folders of ``dialogue_safety`` follow the data flow: imports point down, and never in a circle.

Every module is read with ``ast`` (nothing is imported), and every import counts: at the top,
inside functions, and under ``TYPE_CHECKING`` (a lazy import or a type is still a dependency).
The layers, from the ground up (a folder may import its own modules and those of lower layers,
never a higher layer and never a sibling on its own layer):

0. ``core`` (the model contract: schema, encoding, scoring, model directory and card, batching
   budget, the ONNX runtime and its variants, explanations, item limits, domain errors) and
   ``extras`` (which optional extras are installed): they import nothing else of the project;
1. ``sources``: dataset files → ``LabelledExample``; ``client``: the HTTP client of the service (standard library);
2. ``training``: encoded batches → checkpoint;
3. ``export`` (checkpoint → model directory);
4. ``evaluation``, ``corpus`` and ``breakit``: a model directory judged, files scored, the break-it game;
5. ``service``: HTTP serving (it mounts the break-it router);
6. ``cli``: the commands, and the workflows that cross stages (fix-it: train → export → evaluate).

So nothing below ``service`` imports it: only the command layer does.
The package's own ``__init__`` (the public API) may import ``core`` and ``client`` only, and nothing imports it.
``core`` never imports torch, transformers or the web stack.
The repository's ``lab`` (benchmarks, experiments, research presets) sits above the package, outside
the wheel: it imports the package, and no module of the package imports ``lab``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

PACKAGE = "dialogue_safety"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core", "extras"),
    ("sources", "client"),
    ("training",),
    ("export",),
    ("evaluation", "corpus", "breakit"),
    ("service",),
    ("cli",),
)
#: what the public API (the package's __init__) may import
FACADE_IMPORTS = ("core", "client")
#: third-party packages the ground floor never imports
#: top-level packages of the repository that the installed package never imports (not in the wheel)
NEVER_IMPORTED = frozenset({"lab"})
NOT_IN_CORE = frozenset({"torch", "transformers", "optimum", "fastapi", "starlette", "uvicorn", "pydantic_settings"})

Graph = dict[str, set[str]]


# -- reading the imports -----------------------------------------------------------------------------
def module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def imported_modules(path: Path, module: str, modules: Iterable[str]) -> set[str]:
    """What the module imports: modules of the package by their full name (``from a import b`` is
    ``a.b`` when that is a module, else ``a``), other packages by their top-level name."""
    known = set(modules)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()

    def add(name: str) -> None:
        while name not in known and "." in name:  # `import a.b.c` where c is a name: the module a.b
            name = name.rpartition(".")[0]
        found.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    found.discard(module)
    return found


def import_graph(root: Path) -> tuple[Graph, dict[str, set[str]]]:
    """Module → the modules of the package it imports; module → the other top-level packages it imports."""
    modules = modules_of(root)
    graph: Graph = {}
    external: dict[str, set[str]] = {}
    for module, path in modules.items():
        names = imported_modules(path, module, modules)
        graph[module] = {n for n in names if n in modules}
        external[module] = {n.split(".")[0] for n in names if n not in modules and n.split(".")[0] != root.name}
    return graph, external


# -- judging them ----------------------------------------------------------------------------------
def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def folder_of(module: str) -> str | None:
    """The top-level folder (or module) of the package a module lives in; None for the package's __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def layer_of(folder: str, layers: tuple[tuple[str, ...], ...]) -> int:
    for i, names in enumerate(layers):
        if folder in names:
            return i
    raise KeyError(folder)


def bad_imports(
    graph: Mapping[str, Iterable[str]],
    layers: tuple[tuple[str, ...], ...] = LAYERS,
    facade_imports: tuple[str, ...] = FACADE_IMPORTS,
) -> list[str]:
    """Every import that points up a layer, sideways to a sibling folder, into the package's
    __init__, or out of the __init__ to anything but ``facade_imports``."""
    problems = []
    for source in sorted(graph):
        for target in sorted(graph[source]):
            a, b = folder_of(source), folder_of(target)
            if b is None:
                problems.append(f"{source} -> {target}: the public API is for users; nothing inside imports it")
            elif a is None:
                if b not in facade_imports:
                    problems.append(f"{source} -> {target}: the public API imports only {', '.join(facade_imports)}")
            elif a != b:
                la, lb = layer_of(a, layers), layer_of(b, layers)
                if lb > la:
                    problems.append(f"{source} -> {target}: upward ({a}, layer {la} -> {b}, layer {lb})")
                elif lb == la:
                    problems.append(f"{source} -> {target}: sideways between siblings of layer {la} ({a} -> {b})")
    return problems


# -- the package -----------------------------------------------------------------------------------
GRAPH, EXTERNAL = import_graph(ROOT)


def test_every_folder_has_a_layer() -> None:
    folders = {folder_of(m) for m in GRAPH} - {None}
    assert folders == {f for layer in LAYERS for f in layer}


def test_no_module_imports_another_in_a_circle() -> None:
    found = cycles(GRAPH)
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_every_import_points_down_a_layer() -> None:
    problems = bad_imports(GRAPH)
    assert not problems, "imports against the layers (see this module's docstring):\n" + "\n".join(problems)


def imports_of_the_repository(
    external: Mapping[str, Iterable[str]], never: frozenset[str] = NEVER_IMPORTED
) -> list[str]:
    """Every import of a package that is not installed with ``dialogue_safety`` (``lab``)."""
    return [f"{m} -> {name}" for m in sorted(external) for name in sorted(set(external[m]) & never)]


def test_the_package_never_imports_the_lab() -> None:
    problems = imports_of_the_repository(EXTERNAL)
    assert not problems, "the package imports what the wheel does not install:\n" + "\n".join(problems)


def test_core_imports_no_torch_and_no_web_stack() -> None:
    bad = {m: sorted(EXTERNAL[m] & NOT_IN_CORE) for m in sorted(EXTERNAL) if folder_of(m) == "core"}
    assert not any(bad.values()), {m: names for m, names in bad.items() if names}


# -- the checks themselves fail when they should ------------------------------------------------
@pytest.fixture
def bad_package(tmp_path: Path) -> Path:
    """A package with a circle inside one folder, an upward import, a sideways one and a relative one."""
    root = tmp_path / PACKAGE
    files = {
        "__init__.py": "from dialogue_safety.core.schema import Example\n",
        "core/__init__.py": "",
        "core/schema.py": "Example = object\n",
        "core/encoding.py": "from dialogue_safety.core import schema\n",
        "core/runtime.py": "def f():\n    from dialogue_safety.service.api import app\n",  # lazy, still counted
        "sources/__init__.py": "",
        "sources/a.py": "from dialogue_safety.sources.b import x\ny = 1\n",
        "sources/b.py": "from dialogue_safety.sources import a\nx = 1\n",
        "evaluation/__init__.py": "",
        "evaluation/report.py": "from .. import corpus\n",  # relative, and sideways
        "corpus/__init__.py": "",
        "service/__init__.py": "",
        "service/api.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dialogue_safety\napp = 1\n",
        "cli/__init__.py": "",
        "cli/main.py": "def main():\n    from lab.bench import cli\n",  # lazy, still counted
        "corpus/job.py": "import lab.int8_presets as presets\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def test_the_checks_find_a_circle_and_imports_against_the_layers(bad_package: Path) -> None:
    graph, _ = import_graph(bad_package)
    assert graph["dialogue_safety.core.encoding"] == {"dialogue_safety.core.schema"}
    assert cycles(graph) == [["dialogue_safety.sources.a", "dialogue_safety.sources.b"]]
    problems = bad_imports(graph)
    assert any(p.startswith("dialogue_safety.core.runtime -> dialogue_safety.service.api: upward") for p in problems)
    assert any(p.startswith("dialogue_safety.evaluation.report -> dialogue_safety.corpus: sideways") for p in problems)
    assert any(p.startswith("dialogue_safety.service.api -> dialogue_safety: the public API") for p in problems)
    assert len(problems) == 3, problems
    _, external = import_graph(bad_package)
    assert imports_of_the_repository(external) == [
        "dialogue_safety.cli.main -> lab",
        "dialogue_safety.corpus.job -> lab",
    ]
