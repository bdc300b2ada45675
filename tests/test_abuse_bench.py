"""``python -m lab.bench abuse`` runs end to end (--smoke, tiny model): it starts the real server
through the CLI and replays every attack briefly. No timing assertions (speed lives in the bench)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from lab.bench import abuse


def test_abuse_benchmark_smoke(
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "abuse.json"
    argv = ["--model", str(tiny_model_dir), "--smoke", "--hold-s", "2", "--duration-s", "1", "--json", str(out)]
    assert abuse.main(argv, prog="python -m lab.bench abuse") == 0
    report = json.loads(out.read_text())
    attacks = {o["attack"]: o for o in report["outcomes"]}
    assert set(attacks) == {
        "idle connections",
        "slow bodies",
        "largest requests",
        "overload",
        "overload 4x",
        "hang-ups",
        "bad inputs",
    }
    assert "| attack | what the service did |" in capsys.readouterr().out
    bad = attacks["bad inputs"]["details"]["statuses"]
    assert all(400 <= status < 500 for status in bad.values()), bad  # a 4xx for each, never a 5xx
    assert "500" not in attacks["hang-ups"]["details"]["batch_statuses"]
    assert all(o["rss_peak_mib"] for o in report["outcomes"])
    overload = attacks["overload 4x"]["details"]
    assert overload["sent"] > 0 and overload["generator_lag_p99_ms"] is not None  # the client's lag is shown
    assert {"target_429_p99_le_50ms", "target_ok_p99_le_bound", "accepted_bound_ms"} <= set(overload)
    assert report["machine"]["server_cpus"] != report["machine"]["client_cpus"]
