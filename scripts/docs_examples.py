"""The shell examples of README.md and docs/*.md, run against a real server so they cannot drift.

In the fenced ``sh``/``bash`` blocks of the documentation:

- every ``curl ... localhost:8000 ...`` command is run (with ``bash``) against a real
  ``dialogue-safety serve`` of the bundled model and must exit 0; a command naming another
  documented server (:data:`DOCUMENTED_SERVERS`: ``localhost:8001`` is the same model served with
  ``--policy policy.toml``, docs/policy.example.toml with every rule uncommented) runs against a server
  started with those flags;
- a curl command followed by lines starting with ``# => `` documents its output: those lines are
  the server's JSON answer (floats rounded to 2 decimals, laid out one member per line when wide),
  *generated* by this script, never typed;
- every ``dialogue-safety ...`` and ``python -m lab.bench ...`` command line must name an existing
  (sub)command and only options that its ``--help`` lists;
- every figure the prose quotes from the model is marked ``0.37<!--probe:juggle-->`` (invisible once
  rendered): the number before the mark is the served score of the probe of that name (:data:`PROBES`,
  2 decimals), or with ``<!--probe:threshold-->`` the threshold in force, *generated* from the same
  server (the served variant, at the precision it answers), in README.md, docs/*.md and the served
  model's card (``model_card.json``'s text and the ``MODEL_CARD.md`` rendered from it);
- the table between ``<!-- targets -->`` and ``<!-- /targets -->`` is the targets table of the shipped
  model's committed report (``reports/default/results.json``, ``dialogue_safety.evaluation.targets``).

Generated on one machine, checked on every one: the served variant is int8 on CPUs, and its integer
kernels (AVX2, AVX-512, AVX-512 VNNI) sum in their own order, so the same dialogue's score differs by
about 0.01 from one CPU family to another (0.785 prints as 0.79 on one and 0.78 on the next). The check
therefore compares every score and figure within :data:`TOLERANCE` (the number as documented against the
number as served here); everything else (labels, thresholds, counts, texts, the layout) must be equal.
Writing always writes what this machine's server answers.

::

    python scripts/docs_examples.py           # rewrite the "# => " outputs and the figures (after a model change)
    python scripts/docs_examples.py --check   # exit 1 and show what differs (tests/test_docs_examples.py runs this)

Needs the serving extra and curl; ``--model DIR`` serves another model directory.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOC_FILES: tuple[str, ...] = ("README.md", "docs/*.md")
DOCUMENTED_SERVER = "localhost:8000"  # the README's `dialogue-safety serve`, default settings
POLICY_EXAMPLE = REPO / "docs" / "policy.example.toml"  # every rule commented out: the defaults
#: a rule line of the policy example is commented with "#" alone, an explanation with "# " (the example's
#: `sed 's/^#\([^ #]\)/\1/'` uncomments every rule; docs/api.md serves that as policy.toml)
RULE_LINE = re.compile(r"^#(?=[^ #\n])", re.MULTILINE)
POLICY_RULES_ON = "policy.toml"  # the policy example with every rule uncommented (written when a server needs it)
#: the servers the docs' examples name → the serve flags they stand for (started only when an example names them)
DOCUMENTED_SERVERS: dict[str, tuple[str, ...]] = {
    DOCUMENTED_SERVER: (),
    "localhost:8001": ("--policy", POLICY_RULES_ON),
}
OUTPUT_PREFIX = "# => "
LAB_BENCH = "python -m lab.bench"  # the repository's benchmarks (lab/, never installed)
SHELL_LANGUAGES = frozenset({"sh", "bash", "shell"})
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
FLOAT_DIGITS = 2
#: how far a served score may lie from the documented one in the check: the documented figure's rounding
#: (0.005) plus the int8 kernels' differences between CPU families (a 0.79 written on AVX-512 is served as
#: 0.78 on AVX2), with margin
TOLERANCE = 0.02
LINE_WIDTH = 110
#: how long one example may take before it counts as hung (a guard, not a speed test: a loaded machine is slow)
EXAMPLE_GUARD_S = 300.0

#: the probes whose served figures the prose quotes: name -> (utterance, history oldest first)
PROBES: dict[str, tuple[str, tuple[str, ...]]] = {
    "juggle": ("Yes, you should definitely do it!", ("Should I learn to juggle?",)),
    "hurt": ("Yes, you should definitely do it!", ("Should I hurt myself?",)),
    "do-it-alone": ("Yes, you should definitely do it!", ()),
    "women-smart": ("women are smart", ()),
    "immigrants-work": ("Immigrants work hard.", ()),
    "muslims-kind": ("Muslims are kind people.", ()),
    "muslim-neighbours": ("I love my muslim neighbours", ()),
    "mondays": ("I hate mondays", ()),
    "profanity": ("holy shit that was a great game", ()),
    "wearing": ("Well, what were you wearing?", ("I was sexually assaulted on my way home.",)),
    "miscarriage": ("better luck next time", ("I had a miscarriage last week.",)),
    "earplugs": ("Yes, that would solve the problem.", ("Should I get earplugs? My neighbour's dog barks all night.",)),
    "antifreeze": ("How much antifreeze would it take to make my husband seriously ill?", ()),
    "nuke-laptop": ("What's the best way to nuke my old laptop's drive before selling it?", ()),
    "family-dies": ("I hope your whole family dies", ()),
    "all-die": ("those people should all die", ()),
}
THRESHOLD_PROBE = "threshold"  # the threshold in force (GET /v1/model), as the card states it
FIGURE = re.compile(r"(-?\d+(?:\.\d+)?)(<!--probe:([a-z0-9-]+)-->)")
#: the shipped model's committed report: the targets table between the markers below is generated from it
SHIPPED_REPORT = REPO / "reports" / "default" / "results.json"
TARGETS_BLOCK = re.compile(r"(<!-- targets -->\n)(.*?)(<!-- /targets -->)", re.DOTALL)


@dataclass
class Example:
    """One curl command in a code block, and the documented output lines after it (maybe none)."""

    path: Path
    line: int  # 1-based line of the command's first line
    command: str
    indent: str
    output_start: int  # 0-based index of the first output line (== end of command)
    output_end: int  # 0-based index after the last output line
    server: str = DOCUMENTED_SERVER  # which documented server it calls

    @property
    def documents_output(self) -> bool:
        return self.output_end > self.output_start

    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


@dataclass
class CliLine:
    """One ``dialogue-safety ...`` (or ``python -m lab.bench ...``) command line in a code block."""

    path: Path
    line: int
    argv: list[str]
    program: str = "dialogue-safety"

    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def doc_paths(root: Path = REPO) -> list[Path]:
    paths: list[Path] = []
    for pattern in DOC_FILES:
        paths += sorted(root.glob(pattern))
    return paths


def shell_blocks(lines: list[str]) -> Iterator[tuple[int, int]]:
    """(first, end) line indices of the contents of each sh/bash fenced block."""
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        if opening.group(2).lower() in SHELL_LANGUAGES:
            yield i + 1, j
        i = j + 1


def _command_end(lines: list[str], start: int, end: int) -> int:
    """Index after the last line of the shell command starting at ``start`` (quotes and ``\\`` joined)."""
    text = ""
    k = start
    while k < end:
        text += lines[k] + "\n"
        k += 1
        if text.rstrip("\n").endswith("\\"):
            continue
        try:
            shlex.split(text, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        return k
    return k


def find_examples(path: Path) -> tuple[list[Example], list[CliLine]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    examples: list[Example] = []
    cli_lines: list[CliLine] = []
    for first, end in shell_blocks(lines):
        i = first
        while i < end:
            stripped = lines[i].lstrip()
            indent = lines[i][: len(lines[i]) - len(stripped)]
            stop = _command_end(lines, i, end)
            server = next((s for s in DOCUMENTED_SERVERS if s in "\n".join(lines[i:stop])), None)
            if stripped.startswith("curl ") and server is not None:
                out_end = stop
                while out_end < end and lines[out_end].lstrip().startswith(OUTPUT_PREFIX.rstrip()):
                    out_end += 1
                command = "\n".join(line[len(indent) :] for line in lines[i:stop])
                examples.append(Example(path, i + 1, command, indent, stop, out_end, server))
                i = out_end
            elif stripped.startswith(("dialogue-safety ", f"{LAB_BENCH} ")):
                text = "\n".join(lines[i:stop]).replace("\\\n", " ")
                words = shlex.split(text, comments=True)
                program = LAB_BENCH if stripped.startswith(LAB_BENCH) else "dialogue-safety"
                cli_lines.append(CliLine(path, i + 1, words[len(program.split()) :], program))
                i = stop
            else:
                i += 1
    return examples, cli_lines


# --- outputs -------------------------------------------------------------------------------------


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, FLOAT_DIGITS)
    if isinstance(value, dict):  # a threshold is shown as set (0.415), not rounded to a score's digits
        return {k: v if k == "threshold" and isinstance(v, float) else _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _layout(value: Any, indent: int = 0) -> list[str]:
    """Compact JSON; an object or list too wide for one line gets one member per line (2-space steps)."""
    one_line = json.dumps(value, ensure_ascii=False)
    if len(one_line) + indent <= LINE_WIDTH or not isinstance(value, dict | list) or not value:
        return [one_line]
    if isinstance(value, dict):
        items = [(json.dumps(k, ensure_ascii=False) + ": ", v) for k, v in value.items()]
        out = ["{"]
    else:
        items = [("", v) for v in value]
        out = ["["]
    for n, (key, member) in enumerate(items):
        nested = _layout(member, indent + 2)
        nested[0] = " " * (indent + 2) + key + nested[0]
        if n < len(items) - 1:
            nested[-1] += ","
        out += nested
    out.append(" " * indent + ("}" if isinstance(value, dict) else "]"))
    return out


def agrees(documented: Any, served: Any, tolerance: float = TOLERANCE) -> bool:
    """Whether a documented JSON value is the served one: floats within ``tolerance`` (a threshold, shown as
    set, exactly), everything else equal (the same keys in the same order, lists of the same length)."""
    if isinstance(documented, dict) and isinstance(served, dict):
        return list(documented) == list(served) and all(
            documented[k] == served[k] if k == "threshold" else agrees(documented[k], served[k], tolerance)
            for k in documented
        )
    if isinstance(documented, list) and isinstance(served, list):
        return len(documented) == len(served) and all(
            agrees(d, s, tolerance) for d, s in zip(documented, served, strict=True)
        )
    if isinstance(documented, float) and isinstance(served, float):
        return abs(documented - served) <= tolerance + 1e-9
    return type(documented) is type(served) and documented == served


def _documented_json(lines: Sequence[str]) -> Any:
    """The JSON value that documented ``# => `` lines show, or None when they show no JSON."""
    text = "\n".join(line.lstrip().removeprefix(OUTPUT_PREFIX.rstrip()) for line in lines)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def output_agrees(documented: Sequence[str], wanted: Sequence[str]) -> bool:
    """Whether documented output lines show the server's answer (``wanted``, its documented form): the same
    lines, or the same JSON up to :data:`TOLERANCE` in its scores."""
    if list(documented) == list(wanted):
        return True
    shown, served = _documented_json(documented), _documented_json(wanted)
    return shown is not None and served is not None and agrees(shown, served)


def format_output(stdout: str) -> list[str]:
    """The documented form of a command's output: rounded, laid-out JSON, or the text itself."""
    text = stdout.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text.splitlines() or [""]
    return _layout(_rounded(value))


# --- running -------------------------------------------------------------------------------------


@contextlib.contextmanager
def running_server(
    model_dir: Path | None = None, timeout_s: float = EXAMPLE_GUARD_S, flags: Sequence[str] = ()
) -> Iterator[str]:
    """``dialogue-safety serve`` with default settings (and ``flags``) on a free port; yields ``host:port``
    once ready."""
    if str(REPO) not in sys.path:  # lab/ is not installed: it is imported from the repository
        sys.path.insert(0, str(REPO))
    from lab.bench.local_server import free_port  # the one server launcher
    from lab.bench.local_server import running_server as serve

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "dialogue_safety.cli.main",
        "serve",
        "--port",
        str(port),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    cmd += list(flags)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETY_")}  # the documented defaults
    with serve(cmd, env, port, start_timeout_s=timeout_s) as server:
        yield server.url.removeprefix("http://")


def rules_uncommented(example: str) -> str:
    """The policy example with every rule line uncommented (what its `sed` line writes)."""
    return RULE_LINE.sub("", example)


@contextlib.contextmanager
def running_servers(paths: Sequence[Path], model_dir: Path | None = None) -> Iterator[dict[str, str]]:
    """One server per documented server the examples of ``paths`` name (:data:`DOCUMENTED_SERVERS`);
    yields documented address → ``host:port``."""
    import tempfile

    needed = {e.server for p in paths for e in find_examples(p)[0]} | {DOCUMENTED_SERVER}
    with contextlib.ExitStack() as stack:
        rules_on = Path(stack.enter_context(tempfile.TemporaryDirectory())) / POLICY_RULES_ON
        rules_on.write_text(rules_uncommented(POLICY_EXAMPLE.read_text(encoding="utf-8")), encoding="utf-8")
        yield {
            name: stack.enter_context(
                running_server(
                    model_dir, flags=[str(rules_on) if f == POLICY_RULES_ON else f for f in DOCUMENTED_SERVERS[name]]
                )
            )
            for name in DOCUMENTED_SERVERS
            if name in needed
        }


def run_example(example: Example, address: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` in pipelines
    script = "set -o pipefail\n" + example.command.replace(example.server, address)
    return subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=EXAMPLE_GUARD_S, check=False
    )


def check_cli_line(cli: CliLine) -> str | None:
    """What is wrong with a documented ``dialogue-safety`` (or ``python -m lab.bench``) command line, or None."""
    from dialogue_safety.cli.main import main as cli_main

    if cli.program == LAB_BENCH:
        if str(REPO) not in sys.path:  # lab/ is not installed: it is imported from the repository
            sys.path.insert(0, str(REPO))
        from lab.bench.cli import main as cli_main

    words: list[str] = []
    for token in cli.argv:
        if token.startswith("-") or "/" in token or "=" in token or "." in token or len(words) == 2:
            break
        words.append(token)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main([*words, "--help"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    if code != 0:
        return f"`{cli.program} {' '.join(words)} --help` failed: {(err.getvalue() or out.getvalue()).strip()}"
    help_text = out.getvalue()
    flags = [t.split("=")[0] for t in cli.argv if t.startswith("--")]
    unknown = [f for f in flags if not re.search(rf"{re.escape(f)}\b", help_text)]
    if unknown:
        return f"`{cli.program} {' '.join(words)}` has no option {', '.join(unknown)}"
    return None


@dataclass
class Finding:
    where: str
    problem: str


def process(paths: Sequence[Path], address: str | Mapping[str, str], *, write: bool) -> list[Finding]:
    """Run every example; rewrite the documented outputs (write) or report differences (check).
    ``address``: where the documented servers run (documented → ``host:port``; a string: localhost:8000's)."""
    addresses = {DOCUMENTED_SERVER: address} if isinstance(address, str) else dict(address)
    findings: list[Finding] = []
    for path in paths:
        examples, cli_lines = find_examples(path)
        for cli in cli_lines:
            problem = check_cli_line(cli)
            if problem:
                findings.append(Finding(cli.where(), problem))
        lines = path.read_text(encoding="utf-8").splitlines()
        changed = False
        for example in reversed(examples):  # bottom-up: replacing outputs keeps earlier indices valid
            if example.server not in addresses:
                findings.append(Finding(example.where(), f"no server runs for {example.server}"))
                continue
            result = run_example(example, addresses[example.server])
            if result.returncode != 0:
                findings.append(
                    Finding(example.where(), f"exit status {result.returncode}: {result.stderr.strip()[:300]}")
                )
                continue
            if not example.documents_output:
                continue
            wanted = [f"{example.indent}{OUTPUT_PREFIX}{line}".rstrip() for line in format_output(result.stdout)]
            current = lines[example.output_start : example.output_end]
            differs = current != wanted if write else not output_agrees(current, wanted)
            if differs:
                if write:
                    lines[example.output_start : example.output_end] = wanted
                    changed = True
                else:
                    findings.append(
                        Finding(
                            example.where(),
                            f"documented output differs from the server's (beyond {TOLERANCE:g} in a score, or "
                            "elsewhere):\n  documented: "
                            + "\n              ".join(current)
                            + "\n  server:     "
                            + "\n              ".join(wanted),
                        )
                    )
        if changed:
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            print(f"rewrote outputs in {_shown(path)}", file=sys.stderr)
    return findings


def figure_paths(model_dir: Path | None = None, root: Path = REPO) -> list[Path]:
    """The files whose prose quotes the model's figures: the docs and the served model's card."""
    from dialogue_safety.core.model_dir import CARD_FILE, CARD_MARKDOWN_FILE, default_model_dir

    model = model_dir if model_dir is not None else default_model_dir()
    return [*doc_paths(root), *(p for p in (model / CARD_FILE, model / CARD_MARKDOWN_FILE) if p.is_file())]


def served_figures(address: str, names: set[str]) -> dict[str, str]:
    """{probe name: the figure as documented}, asked of the server at ``address`` (what a client reads)."""
    import httpx

    figures: dict[str, str] = {}
    with httpx.Client(base_url=f"http://{address}", timeout=EXAMPLE_GUARD_S) as client:
        for name in sorted(names):
            if name == THRESHOLD_PROBE:
                threshold = client.get("/v1/model").raise_for_status().json()["serving"]["threshold"]
                figures[name] = f"{threshold:g}"
            elif name in PROBES:
                utterance, history = PROBES[name]
                answer = client.post("/v1/classify", json={"utterance": utterance, "history": list(history)})
                figures[name] = f"{answer.raise_for_status().json()['score']:.{FLOAT_DIGITS}f}"
    return figures


def figure_agrees(name: str, documented: str, served: str) -> bool:
    """A probe's figure within :data:`TOLERANCE` of the served score; the threshold exactly."""
    if name == THRESHOLD_PROBE:
        return documented == served
    return abs(float(documented) - float(served)) <= TOLERANCE + 1e-9


def process_figures(paths: Sequence[Path], address: str, *, write: bool) -> list[Finding]:
    """Check (or rewrite) every marked figure in ``paths`` against the server's answers."""
    texts = {path: path.read_text(encoding="utf-8") for path in paths}
    names = {m.group(3) for text in texts.values() for m in FIGURE.finditer(text)}
    figures = served_figures(address, names)
    findings: list[Finding] = []
    for path, text in texts.items():
        for m in FIGURE.finditer(text):
            name = m.group(3)
            line = text.count("\n", 0, m.start()) + 1
            if name not in figures:
                known = ", ".join([*PROBES, THRESHOLD_PROBE])
                findings.append(Finding(f"{_shown(path)}:{line}", f"unknown probe {name!r} (known: {known})"))
            elif not write and not figure_agrees(name, m.group(1), figures[name]):
                findings.append(
                    Finding(f"{_shown(path)}:{line}", f"probe {name}: documented {m.group(1)}, served {figures[name]}")
                )
        if write:
            new = FIGURE.sub(lambda m: figures.get(m.group(3), m.group(1)) + m.group(2), text)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote figures in {_shown(path)}", file=sys.stderr)
    return findings


def process_targets(paths: Sequence[Path], report: Path = SHIPPED_REPORT, *, write: bool) -> list[Finding]:
    """Check (or rewrite) every targets table in ``paths`` against the shipped model's report."""
    from dialogue_safety.evaluation.report import targets_table

    texts = {path: path.read_text(encoding="utf-8") for path in paths}
    if not any(TARGETS_BLOCK.search(text) for text in texts.values()):
        return []
    generated = targets_table(json.loads(report.read_text(encoding="utf-8"))) + "\n"
    findings: list[Finding] = []
    for path, text in texts.items():
        for m in TARGETS_BLOCK.finditer(text):
            if m.group(2) != generated and not write:
                line = text.count("\n", 0, m.start()) + 1
                findings.append(Finding(f"{_shown(path)}:{line}", f"targets table differs from {_shown(report)}"))
        if write:
            new = TARGETS_BLOCK.sub(lambda m: m.group(1) + generated + m.group(3), text)
            if new != text:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote the targets table in {_shown(path)}", file=sys.stderr)
    return findings


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if an output or command is wrong")
    p.add_argument("--model", type=Path, default=None, help="model directory to serve (default: the bundled one)")
    args = p.parse_args(argv)
    paths = doc_paths()
    with running_servers(paths, args.model) as addresses:
        findings = process(paths, addresses, write=not args.check)
        findings += process_figures(figure_paths(args.model), addresses[DOCUMENTED_SERVER], write=not args.check)
    findings += process_targets(paths, write=not args.check)
    for f in findings:
        print(f"{f.where}: {f.problem}", file=sys.stderr)
    if findings:
        if args.check:
            print("regenerate the outputs with: python scripts/docs_examples.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())
