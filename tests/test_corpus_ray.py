"""``dialogue-safety score --engine ray`` on a local Ray instance with 2 CPUs, on a small file: the
same records as the local engine (scores, error rows, order), the model shipped to the actors."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import IN_CI
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)
from test_corpus import ROWS, write_input

from dialogue_safety.corpus.formats import read_records
from dialogue_safety.corpus.job import ScoreJob, run_local

try:
    import ray  # noqa: F401
except ImportError as exc:  # the 'scale' extra; scripts/test.sh installs it
    if IN_CI:
        raise
    pytest.skip(f"Ray is not installed ({exc}): pip install -e '.[scale]'", allow_module_level=True)

from dialogue_safety.corpus.ray_engine import RayOptions, pack_model, run_ray, unpack_model

pytestmark = pytest.mark.slow


def test_ray_engine_matches_the_local_engine(tmp_path: Path, tiny_model_dir: Path) -> None:
    rows = [*ROWS, *({"id": 100 + i, "utterance": f"row number {i}"} for i in range(30))]
    inp = write_input(tmp_path / "in.jsonl", rows)
    with open(inp, "a", encoding="utf-8") as f:
        f.write("{not json\n")
    local = run_local(ScoreJob(inp, tmp_path / "local.jsonl", model_dir=tiny_model_dir, variant="fp32"), progress=False)
    job = ScoreJob(inp, tmp_path / "ray.csv", model_dir=tiny_model_dir, variant="fp32", chunk_size=8)
    summary = run_ray(job, RayOptions(num_cpus=2), progress=False)
    assert summary.engine == "ray (2 actors x 1 threads)"
    assert (summary.rows, summary.errors) == (local.rows, local.errors) == (len(rows) + 1, 5)
    mine, theirs = read_records(tmp_path / "ray.csv"), read_records(tmp_path / "local.jsonl")
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):  # same order, same scores, same errors
        assert (a["id"], a["label"]) == ((str(b["id"]) if b["id"] is not None else None), b["label"])
        assert (float(a["score"]) if a["score"] else None) == pytest.approx(b["score"], abs=1e-9)
        assert (a["error"] or {}).get("code") == (b["error"] or {}).get("code")
    assert "not valid JSON" in mine[-1]["error"]["message"]


def test_the_model_travels_as_bytes(tiny_model_dir: Path) -> None:
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.schema import Example

    unpacked = unpack_model(pack_model(tiny_model_dir, "fp32"))
    assert unpacked != tiny_model_dir and (unpacked / "model_card.json").is_file()
    example = [Example.from_texts("hello there", ["hi"])]
    a = OnnxClassifier(unpacked, variant="fp32").predict(example)[0].score
    b = OnnxClassifier(tiny_model_dir, variant="fp32").predict(example)[0].score
    assert a == b
    assert json.loads((unpacked / "model_card.json").read_text())["name"] == "tiny-random"


def test_a_successful_ray_run_prints_none_of_rays_harmless_alarms(
    tmp_path: Path, tiny_model_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """An ``E ... core_worker.cc`` line about actor arguments and a token-auth notice came with every run."""
    from dialogue_safety.cli.score import main as score_main

    inp = write_input(tmp_path / "in.jsonl", ROWS)
    argv = [str(inp), str(tmp_path / "out.jsonl"), "--model", str(tiny_model_dir), "--variant", "fp32"]
    assert score_main([*argv, "--engine", "ray", "--num-cpus", "2", "--no-progress"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["rows"] == len(ROWS)
    assert "core_worker" not in err and "Token authentication" not in err, err
    assert "Progress bars disabled" not in err
