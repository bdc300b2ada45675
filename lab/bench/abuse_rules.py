"""The ``python -m lab.bench abuse`` cases of the operator's rules and the corpus reader (issue 55, items 2-4).

* ``policy regex`` (no server): a nested-quantifier pattern (``(\\w+\\s?)+[!?.]{3,}$``, exponential in Python's
  ``re``) and a 100,000-term block list, matched by :class:`dialogue_safety.core.policy.Policy` on the model's
  normalisation: the time of one 4,000-character message, and what the big list adds to a 64-item batch.
  Targets: <= 5 ms each (the message as it is and ending with a curly apostrophe, so not ASCII). Also the time
  of a 4,000-character message with every disguise the normalisation undoes (its slowest path; no target).
* ``policy reload`` (the server with the API key, started with a policy and a policy directory): ``POST
  /admin/policy`` with a FIFO in the policy directory, ``/dev/zero``, a file outside, a NUL byte, a newline,
  a lone surrogate, and a good file. Targets: every bad path 4xx within 100 ms, no file content echoed,
  the good file 200.
* ``corpus hostile csv`` (no server): ``dialogue-safety score`` with ``SAFETY_MAX_BODY_BYTES=1000`` on a CSV
  with over-long quoted fields, unterminated quotes, embedded newlines and NUL bytes. Target: rows in =
  data rows + error rows, the bad records the error rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lab.bench.dialogues import load_dialogues
from lab.bench.http_client import RawHttpClient
from lab.bench.local_server import service_env

NESTED = r"(\w+\s?)+[!?.]{3,}$"
BIG_LIST = 100_000  # terms in the big block list
BATCH = 64
LONG_CHARS = 4000
REPEATS = 20
MATCH_TARGET_MS = 5.0
RELOAD_TARGET_MS = 100.0
SECRET = "hunter2"  # in a TOML file outside the policy directory: never in an answer


def _timed_ms(*fns: Any, repeats: int = REPEATS) -> list[tuple[float, float]]:
    """(median, max) milliseconds of each of ``fns`` over ``repeats`` rounds, the calls interleaved (one of
    each per round, after one unmeasured round) so that a loaded machine's drift hits them alike."""
    times: list[list[float]] = [[] for _ in fns]
    for round_ in range(repeats + 1):
        for fn, kept in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            if round_:
                kept.append((time.perf_counter() - start) * 1000)
    return [(round(sorted(t)[len(t) // 2], 3), round(max(t), 3)) for t in times]


def disguised(words: list[str], rng: random.Random) -> str:
    """``words`` with every disguise the model's normalisation undoes (core/obfuscation.py), one word in two:
    digit swaps, look-alike letters, spaced and stretched letters, a zero-width space: its slowest path."""
    ways = [
        lambda w: w.translate(str.maketrans("aeios", "4310$")),
        lambda w: w.translate(str.maketrans("aeoc", "\u0430\u0435\u043e\u0441")),  # Cyrillic look-alikes
        lambda w: ".".join(w),
        lambda w: w[0] + w[-1] * 4,
        lambda w: w[:1] + "\u200b" + w[1:],
    ]
    return " ".join(rng.choice(ways)(w) if i % 2 else w for i, w in enumerate(words))


def policy_regex(model_dir: str, n_terms: int = BIG_LIST) -> tuple[str, dict[str, Any]]:
    from dialogue_safety.core.encoding import normalise_text
    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.core.policy import parse_policy

    card = ModelCard.load(Path(model_dir))
    rng = random.Random(0)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(700)]
    long_text = " ".join(words)[:LONG_CHARS]  # no "..." at the end: the backtracking engine's worst case
    disguised_text = disguised(words, random.Random(1))[:LONG_CHARS]  # its own draws: the lists below stay put
    curly_text = long_text[: LONG_CHARS - 5] + " it\u2019s"  # one curly apostrophe: not ASCII, no emoji
    nested = parse_policy(f"[[block]]\nname = \"shouting\"\nregexes = ['{NESTED}']\n")
    normalised = normalise_text(long_text, card.encoding_config).casefold()
    regex = nested.block[0].regexes[0]
    timed = _timed_ms(
        lambda: nested.match(long_text, card),
        lambda: normalise_text(long_text, card.encoding_config),
        lambda: regex.search(normalised),
        lambda: nested.match(curly_text, card),
        lambda: nested.match(disguised_text, card),
    )
    (long_median, long_max), (norm_median, _), (regex_median, regex_max), (curly_median, curly_max) = timed[:4]
    disguised_median, disguised_max = timed[4]

    terms = sorted({"".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 12))) for _ in range(n_terms)})
    big_toml = '[[block]]\nname = "big"\nterms = [' + ", ".join(f'"{t}"' for t in terms) + "]\n"
    start = time.perf_counter()
    big = parse_policy(big_toml)
    big.prepare(card)
    build_s = time.perf_counter() - start
    small = parse_policy('[[block]]\nname = "small"\nterms = ["snake oil"]\n')
    small.prepare(card)
    examples, source = load_dialogues(None, BATCH)
    batch = [e.utterance for e in examples][:BATCH]
    (big_median, big_max), (small_median, _) = _timed_ms(
        lambda: [big.match(t, card) for t in batch], lambda: [small.match(t, card) for t in batch]
    )
    added = round(big_median - small_median, 3)
    details = {
        "pattern": NESTED,
        "long_message_chars": len(long_text),
        "long_message_ms_median": long_median,
        "long_message_ms_max": long_max,
        "long_message_normalisation_ms_median": norm_median,  # the model's own (the encoder does it too)
        "long_message_regex_ms_median": regex_median,
        "long_message_regex_ms_max": regex_max,
        "curly_apostrophe_message_ms_median": curly_median,  # the same message ending "it’s": not ASCII
        "curly_apostrophe_message_ms_max": curly_max,
        "disguised_message_chars": len(disguised_text),  # every disguise undone: the normalisation's slowest path
        "disguised_message_ms_median": disguised_median,
        "disguised_message_ms_max": disguised_max,
        "big_list_terms": len(terms),
        "big_list_load_s": round(build_s, 2),
        "batch_items": len(batch),
        "batch_source": source,
        "batch_ms_big_list_median": big_median,
        "batch_ms_big_list_max": big_max,
        "batch_ms_one_term_median": small_median,
        "batch_ms_added_by_big_list": added,
        "target_long_message_within_5ms": max(long_max, curly_max) <= MATCH_TARGET_MS,
        "target_big_list_adds_within_5ms_per_batch": added <= MATCH_TARGET_MS,
    }
    did = (
        f"{NESTED} loaded (RE2); a {len(long_text):,}-char message matched in {long_median} ms (max {long_max}; "
        f"the model's normalisation {norm_median} ms of it, the pattern {regex_median} ms; ending with a curly "
        f"apostrophe {curly_median} ms; a disguised one {disguised_median} ms); "
        f"{len(terms):,} terms loaded in {build_s:.1f} s, a {len(batch)}-item batch {big_median} ms against "
        f"{small_median} ms with one term (+{added} ms)"
    )
    return did, details


async def attack_policy_regex(model_dir: str, n_terms: int = BIG_LIST) -> tuple[str, dict[str, Any]]:
    return await asyncio.to_thread(policy_regex, model_dir, n_terms)


# -- POST /admin/policy --------------------------------------------------------------------------------
def policy_files(root: Path) -> dict[str, str]:
    """A start-up policy, a policy directory (a good file, a FIFO) and a secret outside it, under ``root``:
    the settings of the server the reload case runs against."""
    policies = root / "policies"
    policies.mkdir()
    start = policies / "start.toml"
    start.write_text('[[block]]\nname = "start"\nterms = ["snake oil"]\n', encoding="utf-8")
    (policies / "other.toml").write_text('[[block]]\nname = "other"\nterms = ["snake oil"]\n', encoding="utf-8")
    os.mkfifo(policies / "fifo.toml")
    (root / "secret.toml").write_text(f'password = "{SECRET}"\n', encoding="utf-8")
    return {"policy": str(start), "policy_dir": str(policies)}


def reload_cases(policy_dir: str) -> list[tuple[str, bytes, bool]]:
    """(case, request body, whether it should load)."""
    outside = str(Path(policy_dir).parent / "secret.toml")
    return [
        ("fifo", json.dumps({"path": "fifo.toml"}).encode(), False),
        ("/dev/zero", json.dumps({"path": "/dev/zero"}).encode(), False),
        ("outside file", json.dumps({"path": outside}).encode(), False),
        ("NUL byte", json.dumps({"path": "other\x00.toml"}).encode(), False),
        ("newline", json.dumps({"path": "other.toml\nINFO forged"}).encode(), False),
        ("lone surrogate", b'{"path": "other\\ud800.toml"}', False),
        ("good file", json.dumps({"path": "other.toml"}).encode(), True),
    ]


async def attack_policy_reload(url: str, key: str, policy_dir: str) -> tuple[str, dict[str, Any]]:
    headers = f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n".encode()
    results: dict[str, dict[str, Any]] = {}
    for case, body, good in reload_cases(policy_dir):
        client = RawHttpClient(url, 10.0)
        try:
            start = time.perf_counter()
            status, answer = await client.post("/admin/policy", body, headers)
            elapsed = (time.perf_counter() - start) * 1000
        finally:
            await client.close()
        results[case] = {
            "status": status,
            "ms": round(elapsed, 1),
            "json": answer[:1].decode(errors="replace") == "{",
            "echoed_secret": SECRET.encode() in answer or b"password" in answer,
            "good": good,
        }
    bad = {c: r for c, r in results.items() if not r["good"]}
    details = {
        "cases": results,
        "target_bad_paths_4xx_json": all(400 <= r["status"] < 500 and r["json"] for r in bad.values()),
        "target_bad_paths_within_100ms": all(r["ms"] <= RELOAD_TARGET_MS for r in bad.values()),
        "target_nothing_echoed": not any(r["echoed_secret"] for r in results.values()),
        "target_good_file_loads": all(r["status"] == 200 for r in results.values() if r["good"]),
    }
    did = "; ".join(f"{c}: {r['status']} in {r['ms']} ms" for c, r in results.items())
    return did, details


# -- the corpus reader ---------------------------------------------------------------------------------
ROW_LIMIT_BYTES = 1000
# (the record as written, whether it should be an error row)
HOSTILE_CSV: list[tuple[str, bool]] = [
    ("1,have a nice day\n", False),
    ('2,"' + "a" * 3000 + ' line"\n', True),  # over-long quoted field: the old reader's cut fell inside the quotes
    ("3,hello\n", False),
    ('4,"unterminated\n', True),  # its quote is "closed" by record 6's opening quote
    ("5,world\n", False),
    ('6,"multi\nline\ntext"\n', False),
    ("7,x\x00y\n", False),
    ('8,"' + "b" * 800 + "\n" + "c" * 800 + '"\n', True),
    ('9,"he said ""hi"""\n', False),
    ('10,"never closed\n', True),  # the file ends before its quote closes
    ("11,the last one\n", False),
]


def corpus_hostile_csv(model_dir: str) -> tuple[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="abuse-csv-") as tmp:
        inp, out = Path(tmp) / "hostile.csv", Path(tmp) / "scored.jsonl"
        inp.write_text("id,utterance\n" + "".join(r for r, _ in HOSTILE_CSV), encoding="utf-8")
        cmd = [sys.executable, "-m", "dialogue_safety.cli.main", "score", str(inp), str(out), "--model", model_dir]
        env = service_env(max_body_bytes=ROW_LIMIT_BYTES)
        done = subprocess.run([*cmd, "--no-progress"], env=env, capture_output=True, timeout=600, check=False)
        records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    summary: dict[str, Any] = {}
    if done.returncode == 0:
        summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
    ids_ok = [r["id"] for r in records if r.get("error") is None]
    want_ok = [r.split(",", 1)[0] for r, bad in HOSTILE_CSV if not bad]
    errors = sum(1 for r in records if r.get("error") is not None)
    details = {
        "records_in": len(HOSTILE_CSV),
        "rows_out": len(records),
        "data_rows": len(ids_ok),
        "error_rows": errors,
        "exit": done.returncode,
        "summary": summary,
        "target_rows_in_equal_data_plus_error_rows": len(records) == len(HOSTILE_CSV) == len(ids_ok) + errors,
        "target_bad_records_are_the_error_rows": ids_ok == want_ok,
    }
    did = (
        f"{len(HOSTILE_CSV)} records in (over-long quoted fields, unterminated quotes, embedded newlines, NUL): "
        f"{len(ids_ok)} data rows + {errors} error rows = {len(records)} rows out, exit {done.returncode}"
    )
    return did, details


async def attack_corpus_hostile_csv(model_dir: str) -> tuple[str, dict[str, Any]]:
    return await asyncio.to_thread(corpus_hostile_csv, model_dir)


# -- inference priority ------------------------------------------------------------------------------
def thread_nices(pid: int) -> dict[str, int]:
    """{nice value: how many of ``pid``'s threads run at it} (/proc; Linux), the main thread named apart:
    with ``SAFETY_INFERENCE_NICE`` every inference thread, onnxruntime's included, is below the event loop."""
    counts: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            nice = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, IndexError, ValueError):
            continue
        key = f"main thread {nice}" if task.name == str(pid) else str(nice)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
