"""``python -m lab.bench abuse`` runs end to end (--smoke, tiny model): it starts the real servers
through the CLI and replays every attack briefly. No timing assertions (speed lives in the bench):
what is asserted is what the service answered (no 5xx, 413 for what can never fit, JSON errors, swaps
that free the old model, the corpus job's error row)."""

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
    assert (
        set(attacks)
        == {name for name, _, _ in abuse.ATTACKS}
        == {
            "idle connections",
            "slow bodies",
            "largest requests",
            "largest utterance",
            "largest explained",
            "largest batch",
            "million invalid",
            "too costly",
            "overload",
            "overload 4x",
            "hang-ups",
            "bad inputs",
            "http edges",
            "hot swaps",
            "break-it ids",
            "corpus nested line",
            "policy regex",
            "policy reload",
            "corpus hostile csv",
        }
    )
    table = capsys.readouterr().out
    assert "| attack | what the service did |" in table and "| corpus nested line |" in table
    bad = attacks["bad inputs"]["details"]["statuses"]
    assert all(400 <= status < 500 for status in bad.values()), bad  # a 4xx for each, never a 5xx
    assert "500" not in attacks["hang-ups"]["details"]["batch_statuses"]
    offline = {name for name, kind, _ in abuse.ATTACKS if kind == "none"}  # no server, no RSS
    assert all(o["rss_peak_mib"] for o in report["outcomes"] if o["attack"] not in offline)
    overload = attacks["overload 4x"]["details"]
    assert overload["sent"] > 0 and overload["generator_lag_p99_ms"] is not None  # the client's lag is shown
    assert {"target_429_p99_le_50ms", "target_ok_p99_le_bound", "accepted_bound_ms"} <= set(overload)
    assert report["machine"]["server_cpus"] != report["machine"]["client_cpus"]

    # round two (issue 39): each answer is a status the service chose, never a 5xx
    for name in ("largest utterance", "largest explained", "largest batch"):
        details = attacks[name]["details"]
        assert details["statuses"] and not any(s.startswith("5") or s == "closed" for s in details["statuses"])
        assert {"target_prober_p99_within_3x_quiet", "target_prober_none_refused"} <= set(details)
    batch = attacks["largest batch"]["details"]
    assert 1 <= batch["items"] <= batch["max_batch_items"]
    assert "200" in batch["statuses"], batch  # the largest batch the limits allow is served
    if batch["items"] < batch["max_batch_items"]:  # the cost limit decided: one item more can never fit
        assert batch["one_more_item"] == "413 request_too_costly", batch
    # round three (issue 55): refused from the counts and from the characters, 4xx only, RSS measured
    million = attacks["million invalid"]["details"]
    assert million["target_4xx_each"], million["cases"]
    assert {"target_answer_p99_le_200ms", "target_rss_growth_le_50mib", "rss_growth_mib"} <= set(million)
    costly = attacks["too costly"]["details"]
    assert costly["target_all_413_or_paused"], costly["statuses"]
    edges = attacks["http edges"]["details"]
    assert edges["target_no_5xx"] and edges["target_no_redirect"] and edges["target_every_answer_json"], edges
    assert edges["cases"]["duplicate keys"]["statuses"] == {"400": 1}
    assert edges["cases"]["POST /v1/classify/ Host: evil.example"]["statuses"] == {"404": 1}
    [head] = [case for name, case in edges["cases"].items() if name.startswith("head of")]
    assert set(head["statuses"]) <= {"431", "None"} and "431" in head["statuses"], head
    swaps = attacks["hot swaps"]["details"]
    assert swaps["statuses"] == {"200": 2} and swaps["released"] == 2, swaps
    assert swaps["threads_before"] and swaps["rss_before_mib"] and swaps["target_prober_nothing_dropped"], swaps
    ids = attacks["break-it ids"]["details"]
    assert len(ids["statuses"]) == 10 and ids["target_all_4xx"], ids
    corpus = attacks["corpus nested line"]["details"]
    assert corpus["target_exit_0"] and corpus["target_blank_line_counted"] and corpus["target_every_row_written"]
    assert corpus["target_error_row_names_file_and_line"], corpus["error_rows"]
    assert "nested deeper than" in corpus["error_rows"][0]
    if corpus["interrupted"]:  # the first run was stopped after its first parts: the second resumed them
        assert corpus["target_resumed"], corpus


def test_attacks_are_selected_by_name_or_first_word() -> None:
    assert [name for name, _, _ in abuse.selected_attacks("largest")] == [
        "largest requests",
        "largest utterance",
        "largest explained",
        "largest batch",
    ]
    assert [name for name, _, _ in abuse.selected_attacks("largest batch,http")] == ["largest batch", "http edges"]
    with pytest.raises(SystemExit, match="unknown"):
        abuse.selected_attacks("largets")


def test_the_rules_and_corpus_cases_hold_their_targets_of_behaviour(
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The policy and CSV cases alone (issue 55): what they assert of behaviour (4xx JSON, nothing echoed,
    the good file loaded, rows in = data rows + error rows); their timings are the bench's, not checked here."""
    out = tmp_path / "rules.json"
    attacks = "policy regex,policy reload,corpus hostile csv"
    argv = ["--model", str(tiny_model_dir), "--smoke", "--attacks", attacks, "--json", str(out)]
    assert abuse.main(argv, prog="python -m lab.bench abuse") == 0
    outcomes = {o["attack"]: o["details"] for o in json.loads(out.read_text())["outcomes"]}
    reload = outcomes["policy reload"]
    assert reload["target_bad_paths_4xx_json"] and reload["target_nothing_echoed"], reload["cases"]
    assert reload["target_good_file_loads"], reload["cases"]
    csv = outcomes["corpus hostile csv"]
    assert csv["target_rows_in_equal_data_plus_error_rows"] and csv["target_bad_records_are_the_error_rows"], csv
    regex = outcomes["policy regex"]
    assert regex["big_list_terms"] == 2000 and regex["long_message_chars"] == regex["disguised_message_chars"] == 4000
