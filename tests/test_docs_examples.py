"""Docs are tested: the curl examples of README.md and docs/*.md run against a real server of the
bundled model, their ``# => `` outputs are what it answers, the figures the prose and the model card
quote (``0.37<!--probe:NAME-->``) are what it scores, and every documented
``dialogue-safety`` command line names real (sub)commands and options (scripts/docs_examples.py).

When the model changes, regenerate the outputs: ``python scripts/docs_examples.py``.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from service_conftest import FakeClassifier, live_server

from dialogue_safety.core.model_dir import CARD_FILE, CARD_MARKDOWN_FILE

REPO = Path(__file__).resolve().parents[1]


def load_docs_examples() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_examples", REPO / "scripts" / "docs_examples.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_examples"] = module
    spec.loader.exec_module(module)
    return module


docs_examples = load_docs_examples()


@pytest.fixture(scope="module")
def curl() -> str:
    path = shutil.which("curl")
    assert path, "the documented examples are curl commands: install curl"
    return path


def test_examples_are_found_in_the_docs() -> None:
    found = {p.name: docs_examples.find_examples(p) for p in docs_examples.doc_paths()}
    readme_examples, readme_cli = found["README.md"]
    assert sum(e.documents_output for e in readme_examples) >= 3
    assert any(cli.argv[:1] == ["evaluate"] for cli in readme_cli)
    assert any(cli.program == docs_examples.LAB_BENCH and cli.argv[:1] == ["runtime"] for cli in readme_cli)
    api_examples, _ = found["api.md"]
    assert any("/health" in e.command and e.documents_output for e in api_examples)


def test_documented_lab_bench_lines_are_checked_against_its_help() -> None:
    bench = docs_examples.LAB_BENCH
    assert docs_examples.check_cli_line(docs_examples.CliLine(Path("x.md"), 1, ["runtime", "--smoke"], bench)) is None
    flag = docs_examples.CliLine(Path("x.md"), 1, ["runtime", "--no-such-flag"], bench)
    assert docs_examples.check_cli_line(flag) == "`python -m lab.bench runtime` has no option --no-such-flag"
    unknown = docs_examples.check_cli_line(docs_examples.CliLine(Path("x.md"), 1, ["nope"], bench))
    assert unknown is not None and unknown.startswith("`python -m lab.bench nope --help` failed")


def test_outputs_are_generated_and_drift_is_caught(tmp_path: Path, curl: str) -> None:
    doc = tmp_path / "example.md"
    doc.write_text(
        "```sh\n"
        "curl -s localhost:8000/v1/classify -H 'content-type: application/json' -d '{\n"
        '  "utterance": "hello"}\'\n'
        "# => typed by hand\n"
        "curl -s localhost:8000/health   # no documented output: only has to succeed\n"
        "```\n",
        encoding="utf-8",
    )
    with live_server(classifier=FakeClassifier()) as server:
        address = f"127.0.0.1:{server.port}"
        drift = docs_examples.process([doc], address, write=False)
        assert len(drift) == 1 and "documented output differs" in drift[0].problem
        assert "typed by hand" in doc.read_text(encoding="utf-8"), "check mode changes nothing"
        assert docs_examples.process([doc], address, write=True) == []
        written = doc.read_text(encoding="utf-8")
        assert "typed by hand" not in written and '# =>   "label": ' in written and '"model": "fake@1.2.3"' in written
        assert docs_examples.process([doc], address, write=False) == []
    failing = tmp_path / "failing.md"
    failing.write_text("```bash\ncurl -sf localhost:8000/nope\ndialogue-safety evaluate x --no-such-flag\n```\n")
    with live_server(classifier=FakeClassifier()) as server:
        problems = docs_examples.process([failing], f"127.0.0.1:{server.port}", write=False)
    assert [p.problem.split(":")[0] for p in problems] == [
        "`dialogue-safety evaluate x` has no option --no-such-flag",
        "exit status 22",
    ]


def test_scores_are_checked_within_the_stated_tolerance_and_everything_else_exactly() -> None:
    """The served int8 differs by CPU family (AVX2, AVX-512, VNNI) in the second decimal: a documented score
    holds within TOLERANCE; a label, a threshold, a count or a key does not move at all."""
    tol = docs_examples.TOLERANCE
    assert 0.01 < tol < 0.05
    served = {"label": "SAFE", "score": 0.78, "threshold": 0.395, "categories": {"violence": 0.78}, "windows": 1}
    assert docs_examples.agrees({**served, "score": 0.79, "categories": {"violence": 0.79}}, served)
    assert docs_examples.agrees({**served, "score": round(0.78 + tol, 2)}, served)
    assert not docs_examples.agrees({**served, "score": round(0.78 + tol + 0.01, 2)}, served)
    assert not docs_examples.agrees({**served, "label": "OFFENSIVE"}, served)
    assert not docs_examples.agrees({**served, "threshold": 0.4}, served), "a threshold is shown as set"
    assert not docs_examples.agrees({**served, "windows": 2}, served)
    assert not docs_examples.agrees({**served, "categories": {"violent": 0.78}}, served)
    assert not docs_examples.agrees({k: v for k, v in served.items() if k != "windows"}, served)
    assert docs_examples.figure_agrees("violence", "0.79", "0.78") and not docs_examples.figure_agrees(
        "x", "0.75", "0.78"
    )
    assert not docs_examples.figure_agrees(docs_examples.THRESHOLD_PROBE, "0.396", "0.395")


def test_a_documented_output_from_another_cpu_family_passes_the_check(tmp_path: Path, curl: str) -> None:
    """Written on one machine, checked on another: a score one hundredth off passes, a label that differs
    does not; writing replaces what differs with this server's answer, exactly."""
    doc = tmp_path / "example.md"
    doc.write_text(
        "```sh\n"
        "curl -s localhost:8000/v1/classify -H 'content-type: application/json' -d '{\"utterance\": \"hi\"}'\n"
        "# => x\n"
        "```\n",
        encoding="utf-8",
    )
    with live_server(classifier=FakeClassifier()) as server:
        address = f"127.0.0.1:{server.port}"
        docs_examples.process([doc], address, write=True)
        written = doc.read_text(encoding="utf-8")
        assert '"score": 0.1,' in written  # the fake's score of a clean utterance
        doc.write_text(written.replace('"score": 0.1,', '"score": 0.11,'), encoding="utf-8")
        assert docs_examples.process([doc], address, write=False) == []
        doc.write_text(written.replace('"score": 0.1,', '"score": 0.15,'), encoding="utf-8")
        [far] = docs_examples.process([doc], address, write=False)
        assert "beyond 0.02" in far.problem and '"score": 0.15' in far.problem
        doc.write_text(written.replace('"label": "SAFE"', '"label": "OFFENSIVE"'), encoding="utf-8")
        assert len(docs_examples.process([doc], address, write=False)) == 1
        docs_examples.process([doc], address, write=True)
        assert doc.read_text(encoding="utf-8") == written


def test_examples_of_the_policy_server_run_against_a_server_of_their_own(tmp_path: Path, curl: str) -> None:
    doc = tmp_path / "policy.md"
    doc.write_text("```sh\ncurl -sf localhost:8001/health\ncurl -sf localhost:8000/health\n```\n", encoding="utf-8")
    [policy_example, plain_example] = docs_examples.find_examples(doc)[0]
    assert (policy_example.server, plain_example.server) == ("localhost:8001", "localhost:8000")
    with live_server(classifier=FakeClassifier()) as server:
        address = f"127.0.0.1:{server.port}"
        missing = docs_examples.process([doc], address, write=False)
        assert [f.problem for f in missing] == ["no server runs for localhost:8001"]
        both = {"localhost:8000": address, "localhost:8001": address}
        assert docs_examples.process([doc], both, write=False) == []


@pytest.mark.slow
def test_the_docs_match_the_bundled_model_served_for_real(curl: str) -> None:
    paths = docs_examples.doc_paths()
    with docs_examples.running_servers(paths) as addresses:
        findings = docs_examples.process(paths, addresses, write=False)
        findings += docs_examples.process_figures(
            docs_examples.figure_paths(), addresses[docs_examples.DOCUMENTED_SERVER], write=False
        )
    assert not findings, (
        "\n".join(f"{f.where}: {f.problem}" for f in findings)
        + "\nregenerate the outputs with: python scripts/docs_examples.py"
    )


def test_figures_in_the_prose_are_generated_from_the_served_model_and_drift_is_caught(tmp_path: Path) -> None:
    """``0.37<!--probe:NAME-->`` in prose is the served score of that probe (the fake: 0.10 for a clean
    utterance), ``<!--probe:threshold-->`` the threshold in force; an unknown probe name is an error."""
    doc = tmp_path / "card.md"
    doc.write_text(
        "- replies score 0.42<!--probe:juggle--> (threshold 0.5<!--probe:threshold-->)\n"
        "- and 0.3<!--probe:no-such-probe-->\n",
        encoding="utf-8",
    )
    with live_server(classifier=FakeClassifier()) as server:
        address = f"127.0.0.1:{server.port}"
        found = docs_examples.process_figures([doc], address, write=False)
        assert [f.problem for f in found] == [
            "probe juggle: documented 0.42, served 0.10",
            f"unknown probe 'no-such-probe' (known: {', '.join([*docs_examples.PROBES, 'threshold'])})",
        ]
        assert "0.42<!--probe:juggle-->" in doc.read_text(encoding="utf-8"), "check mode changes nothing"
        docs_examples.process_figures([doc], address, write=True)
        assert doc.read_text(encoding="utf-8").startswith("- replies score 0.10<!--probe:juggle--> (threshold 0.5")
        assert [f.problem for f in docs_examples.process_figures([doc], address, write=False)] == [found[1].problem]


def test_the_model_card_and_the_readme_quote_probes_the_generator_knows() -> None:
    paths = docs_examples.figure_paths(REPO / "models" / "default")
    assert {p.name for p in paths} >= {"README.md", CARD_FILE, CARD_MARKDOWN_FILE}
    marks = {p.name: [m.group(3) for m in docs_examples.FIGURE.finditer(p.read_text(encoding="utf-8"))] for p in paths}
    assert {"juggle", "hurt", "threshold"} <= set(marks["README.md"])
    assert "threshold" in marks[CARD_MARKDOWN_FILE] and len(set(marks[CARD_MARKDOWN_FILE])) > 1  # probes quoted
    assert marks[CARD_MARKDOWN_FILE] == marks[CARD_FILE]
    known = {*docs_examples.PROBES, docs_examples.THRESHOLD_PROBE}
    assert all(set(names) <= known for names in marks.values()), marks


def test_the_shipped_model_card_markdown_is_rendered_from_its_json() -> None:
    """The generator rewrites the figures in both files; they stay one card."""
    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.export.card_markdown import render_model_card

    model = REPO / "models" / "default"
    assert (model / CARD_MARKDOWN_FILE).read_text(encoding="utf-8") == render_model_card(ModelCard.load(model))
