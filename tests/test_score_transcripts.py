"""``dialogue-safety score`` on chat transcripts (a ``messages`` field per row) and under an operator
policy, on the tiny exported model with a real ONNX Runtime session."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import IN_CI
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.cli.score import main as score_main
from dialogue_safety.corpus.formats import read_records

CHAT = [
    {"role": "system", "content": "be nice"},
    {"role": "user", "content": "what do you think of my soup?"},
    {"role": "assistant", "content": [{"type": "text", "text": "it looks like banana"}]},
]
ROWS = [
    {"id": 1, "messages": CHAT},
    {"id": 2, "messages": json.dumps(CHAT)},  # as a CSV cell would hold it
    {"id": 3, "utterance": "it looks like banana", "history": [{"speaker": "user", "text": CHAT[1]["content"]}]},
    {"id": 4, "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
    {"id": 5, "utterance": "have a nice day"},
]


def test_transcripts_are_judged_on_their_last_message_and_the_policy_decides(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    base = [str(inp), "--model", str(tiny_model_dir), "--variant", "fp32", "--no-progress"]
    assert score_main([base[0], str(tmp_path / "plain.jsonl"), *base[1:]]) == 0
    plain = {r["id"]: r for r in read_records(tmp_path / "plain.jsonl")}
    assert "policy" not in plain[1]  # no policy: the output columns are as before
    assert plain[1]["score"] == pytest.approx(plain[3]["score"], abs=1e-6) == pytest.approx(plain[2]["score"], abs=1e-6)
    assert plain[4]["error"]["code"] == "unsupported_content" and plain[4]["error"]["field"] == "messages[0].content[0]"

    policy = tmp_path / "policy.toml"
    policy.write_text('[[block]]\nname = "no-fruit"\nterms = ["banana"]\n', encoding="utf-8")
    assert score_main([base[0], str(tmp_path / "ruled.jsonl"), *base[1:], "--policy", str(policy)]) == 0
    ruled = {r["id"]: r for r in read_records(tmp_path / "ruled.jsonl")}
    assert [ruled[i]["policy"] for i in (1, 2, 3, 5)] == ["no-fruit", "no-fruit", "no-fruit", None]
    assert [ruled[i]["label"] for i in (1, 2, 3)] == ["OFFENSIVE"] * 3
    assert ruled[5]["label"] == plain[5]["label"] and ruled[1]["score"] == plain[1]["score"]
    capsys.readouterr()

    policy.write_text('[[block]]\nname = "no-fruit"\nterms = "banana"\n', encoding="utf-8")
    assert score_main([base[0], str(tmp_path / "bad.jsonl"), *base[1:], "--policy", str(policy)]) == 2
    assert f"{policy}:3: block[0].terms must be a list of non-empty strings" in capsys.readouterr().err
    assert not (tmp_path / "bad.jsonl").exists()


@pytest.mark.slow
def test_the_ray_engine_reads_transcripts_and_applies_the_policy_as_the_local_one(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    try:
        import ray  # noqa: F401
    except ImportError as exc:  # the 'scale' extra; scripts/test.sh installs it (and CI must have it)
        if IN_CI:
            raise
        pytest.skip(f"Ray is not installed ({exc}): pip install -e '.[scale]'")
    from dialogue_safety.corpus.job import ScoreJob, run_local
    from dialogue_safety.corpus.ray_engine import RayOptions, run_ray

    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    policy = tmp_path / "policy.toml"
    policy.write_text('[[block]]\nname = "no-fruit"\nterms = ["banana"]\n', encoding="utf-8")
    common = {"model_dir": tiny_model_dir, "variant": "fp32", "policy": policy}
    run_local(ScoreJob(inp, tmp_path / "local.jsonl", **common), progress=False)
    run_ray(ScoreJob(inp, tmp_path / "ray.jsonl", chunk_size=2, **common), RayOptions(num_cpus=2), progress=False)
    local, ray = read_records(tmp_path / "local.jsonl"), read_records(tmp_path / "ray.jsonl")
    assert [(r["id"], r["label"], r["policy"]) for r in ray] == [(r["id"], r["label"], r["policy"]) for r in local]
    assert [r["policy"] for r in ray] == ["no-fruit", "no-fruit", "no-fruit", None, None]
