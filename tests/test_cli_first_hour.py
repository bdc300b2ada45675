"""A new user's first hour: missing extras and wrong paths fail at once, with one line saying what to do.

Each test makes sure the expensive part (loading data, running load phases, evaluating) is never
reached: it is replaced by a function that fails the test if called.
"""

from __future__ import annotations

import sys
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

import dialogue_safety.cli.dispatch
import dialogue_safety.core.model_dir
from dialogue_safety import extras
from dialogue_safety.cli.main import COMMANDS, EXTRAS, dispatch

REPO = Path(__file__).resolve().parents[1]


def never(*_: Any, **__: Any) -> Any:
    pytest.fail("the command did work before checking its arguments")


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert "Traceback" not in text
    return lines[0]


# --- extras -------------------------------------------------------------------------------------


def test_extras_come_from_the_package_metadata() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    declared = pyproject["project"]["optional-dependencies"]
    for command, extra in EXTRAS.items():
        assert command in COMMANDS and extra in declared
    evaluate = extras.extra_requirements("evaluate")
    assert evaluate is not None, "the package is installed (pip install -e .) in the test environment"
    assert "scikit-learn" in evaluate
    assert "onnxruntime" in evaluate, "evaluate's self-reference to the serve extra is expanded"
    assert "torch" not in evaluate, "exported models are evaluated without torch"
    assert extras.extra_requirements("no-such-extra") is None
    assert extras.extra_providing("sklearn") == "evaluate"
    assert extras.extra_providing("torch") == "train"
    assert extras.extra_providing("fastapi") == "serve"


def test_a_command_whose_extra_is_missing_names_it_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    imported: list[str] = []
    monkeypatch.setattr(
        dialogue_safety.cli.dispatch, "missing_distributions", lambda extra: ["torch"] if extra == "train" else []
    )
    monkeypatch.setattr(
        dialogue_safety.cli.dispatch.importlib, "import_module", lambda name: imported.append(name) or never()
    )
    assert dispatch(COMMANDS, ["export", "--help"], extras=EXTRAS) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("dialogue-safety export: needs the 'train' extra (not installed: torch)")
    assert "scripts/env.sh train" in line and "dialogue-safety[train]" in line
    assert imported == [], "the command's module is not imported"


def test_a_missing_third_party_module_is_one_line_naming_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def main(argv: list[str], prog: str) -> int:
        raise ModuleNotFoundError("No module named 'scipy'", name="scipy")

    monkeypatch.setitem(sys.modules, "fake_command", types.SimpleNamespace(main=main))
    assert dispatch({"fake": ("fake_command", "")}, ["fake"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "'scipy' is not installed" in line and "'evaluate' extra" in line


def test_a_missing_module_of_our_own_is_a_bug_not_an_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    def main(argv: list[str], prog: str) -> int:
        raise ModuleNotFoundError("No module named 'dialogue_safety.nope'", name="dialogue_safety.nope")

    monkeypatch.setitem(sys.modules, "fake_command", types.SimpleNamespace(main=main))
    with pytest.raises(ModuleNotFoundError):
        dispatch({"fake": ("fake_command", "")}, ["fake"])


# --- paths are checked first --------------------------------------------------------------------


def test_export_checks_its_checkpoint_before_reading_any_data(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from dialogue_safety.export import cli as export_cli

    monkeypatch.setattr(export_cli, "load_test_sets", never)
    assert export_cli.main([str(tmp_path / "checkpoints" / "default"), str(tmp_path / "model")]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"no checkpoint at {tmp_path / 'checkpoints' / 'default'}" in line
    assert "dialogue-safety train --config default" in line and "--config tiny" in line
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    assert export_cli.main([str(tmp_path / "half"), str(tmp_path / "model")]) == 2
    assert "not a training checkpoint (no model.safetensors)" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "model").exists()


def test_evaluate_checks_files_and_model_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from dialogue_safety.evaluation import evaluate

    monkeypatch.setattr(evaluate, "run_evaluation", never)
    monkeypatch.setattr(evaluate, "load_scorer", never)
    missing_csv = tmp_path / "HatemojiCheck.csv"
    code = evaluate.main(["tfidf-baseline", "--functional-csv", f"hatemojicheck={missing_csv}"], prog="evaluate")
    assert code == 2
    assert f"--functional-csv: no file at {missing_csv}" in one_line(capsys.readouterr().err)
    assert evaluate.main([str(tmp_path / "nope")], prog="evaluate") == 2
    assert f"{tmp_path / 'nope'}: model directory does not exist" in one_line(capsys.readouterr().err)
    (tmp_path / "empty").mkdir()
    assert evaluate.main([str(tmp_path / "empty")], prog="evaluate") == 2
    assert "neither an exported model directory" in one_line(capsys.readouterr().err)


def test_evaluate_writes_under_runs_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from dialogue_safety.evaluation import evaluate

    seen: dict[str, Path] = {}

    def fake_run(scorer: Any, data_dir: Path, out: Path, config: Any, **_: Any) -> dict[str, Any]:
        seen["out"] = out
        return {"timings_s": {}}

    monkeypatch.setattr(evaluate, "run_evaluation", fake_run)
    monkeypatch.setenv("DIALOGUE_SAFETY_DATA_DIR", str(tmp_path))
    assert evaluate.main(["tfidf-baseline"], prog="evaluate") == 0
    assert seen["out"] == Path("runs") / "evaluate" / "tfidf-baseline"
    assert evaluate.main(["tfidf-baseline", "--out", str(tmp_path / "r")], prog="evaluate") == 0
    assert seen["out"] == tmp_path / "r"


def test_bench_http_checks_the_naive_checkpoint_before_any_phase(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from lab.bench import http

    monkeypatch.setattr(http, "load_dialogues", never)
    monkeypatch.setattr(http, "running_server", never)
    code = http.main(["--model", str(REPO / "models" / "default"), "--naive-checkpoint", str(tmp_path / "ckpt")])
    assert code == 2
    line = one_line(capsys.readouterr().err)
    assert f"--naive-checkpoint: no checkpoint at {tmp_path / 'ckpt'}" in line


def test_bench_runtime_checks_the_checkpoint_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from lab.bench import runtime_speed as runtime

    monkeypatch.setattr(runtime, "subject_for", never)
    assert runtime.main(["--checkpoint", str(tmp_path / "ckpt")]) == 2
    assert f"no checkpoint at {tmp_path / 'ckpt'}" in one_line(capsys.readouterr().err)
    assert runtime.main(["--model", str(tmp_path / "model")]) == 2
    assert f"no model directory at {tmp_path / 'model'}" in one_line(capsys.readouterr().err)


# --- the bundled model wherever the package is installed ----------------------------------------


def test_the_bundled_model_is_found_in_a_checkout_and_in_an_installation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert dialogue_safety.core.model_dir.default_model_dir() == REPO / "models" / "default"
    # a non-editable install: the code in site-packages, the model under <prefix>/share (data files)
    site = tmp_path / "prefix" / "lib" / "site-packages"
    (site / "dialogue_safety" / "core").mkdir(parents=True)
    monkeypatch.setattr(
        dialogue_safety.core.model_dir, "__file__", str(site / "dialogue_safety" / "core" / "model_dir.py")
    )
    monkeypatch.setattr(
        dialogue_safety.core.model_dir.sysconfig, "get_path", lambda name, scheme=None: str(tmp_path / "prefix")
    )
    installed = tmp_path / "prefix" / dialogue_safety.core.model_dir.INSTALLED_MODEL
    assert dialogue_safety.core.model_dir.default_model_dir() == site / "models" / "default", (
        "nothing found: the first candidate"
    )
    installed.mkdir(parents=True)
    assert dialogue_safety.core.model_dir.default_model_dir() == installed


def test_the_package_installs_exactly_the_committed_model_files() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    data_files = pyproject["tool"]["setuptools"]["data-files"]
    assert list(data_files) == [str(dialogue_safety.core.model_dir.INSTALLED_MODEL)]
    listed = {Path(f).name for f in data_files[str(dialogue_safety.core.model_dir.INSTALLED_MODEL)]}
    bundled = REPO / dialogue_safety.core.model_dir.BUNDLED_MODEL
    assert all((bundled / name).is_file() for name in listed)
    derived = {p.name for p in bundled.iterdir() if p.name.startswith("model.") and p.name.count(".") > 1}
    assert listed == {p.name for p in bundled.iterdir() if p.is_file() and not p.name.startswith(".")} - derived


def test_the_ablation_explains_its_options_and_checks_them_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from lab.experiments import ablation

    with pytest.raises(SystemExit) as exit_:
        ablation.main(["--help"])
    assert exit_.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--data-dir", "--out", "--recipe", "--seeds", "--modes", "--set"):
        line = next(line for line in help_text.splitlines() if line.strip().startswith(flag))
        assert len(line.split()) > 2, f"{flag} has no help: {line!r}"
    assert ablation.main(["--modes", "segments,sideways", "--out", str(tmp_path / "out")]) == 2
    assert "unknown mode(s) sideways" in one_line(capsys.readouterr().err)
    assert ablation.main(["--data-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert "does not exist" in one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_every_extras_install_hint_names_a_setup_job_that_installs_it() -> None:
    import re
    import subprocess

    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for extra in declared:
        match = re.search(r"scripts/env\.sh (\w+)", extras.install_hint(extra))
        assert match, extras.install_hint(extra)
        job_extras = subprocess.run(
            ["bash", str(REPO / "scripts" / "env.sh"), "extras", match.group(1)], capture_output=True, text=True
        )
        assert job_extras.returncode == 0, f"{extra}: scripts/env.sh has no job {match.group(1)!r}"
        job = match.group(1)
        assert extra in job_extras.stdout.strip().split(","), f"scripts/env.sh {job} does not install {extra}"
