"""``python -m lab.bench conversation``: every turn of a conversation in one call against one call per turn.

A local ``dialogue-safety serve`` (a subprocess) judges the same N-turn conversation (default 20 turns,
alternating user and assistant, the texts of the benchmark dialogues, :mod:`lab.bench.dialogues`) three
ways, in one run, ``--rounds`` times each, interleaved:

* ``conversation``: one ``POST /v1/classify/conversation`` with the N messages (every turn judged);
* ``sequential``: N ``POST /v1/classify`` calls one after the other, call k with the messages up to turn k
  (what a client without the endpoint does, resending the history each time);
* ``concurrent``: the same N calls sent at once (the batcher may batch them together).

It prints JSON and a markdown table: the median wall time per conversation of each way, its ratio to the
one call, the request bytes sent, and the largest score difference between the one call and the
per-turn calls (the same turns, the same model: a check that they answer the same). Timings on a shared
machine vary; the ratio in one run is the figure to quote.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from dialogue_safety.core.model_dir import default_model_dir
from lab.bench.dialogues import load_dialogues
from lab.bench.emit import emit_report
from lab.bench.local_server import free_port, running_server, service_cmd, service_env

ROLES = ("user", "assistant")
WAYS = ("conversation", "sequential", "concurrent")


def conversation(turns: int, data_dir: Path | None, seed: int = 0) -> tuple[list[dict[str, str]], str]:
    """``turns`` chat messages, alternating user and assistant: the texts of the benchmark dialogues
    (history turns, then utterance, dialogue after dialogue), and where they come from."""
    dialogues, note = load_dialogues(data_dir, limit=turns, seed=seed)
    texts = [t for d in dialogues for t in (*(h.text for h in d.history), d.utterance) if t.strip()]
    if len(texts) < turns:
        raise SystemExit(f"only {len(texts)} texts in the benchmark dialogues; ask for fewer --turns")
    return [{"role": ROLES[i % 2], "content": texts[i]} for i in range(turns)], note


async def _one_call(client: httpx.AsyncClient, messages: list[dict[str, str]]) -> tuple[list[float], int]:
    body = json.dumps({"messages": messages}).encode()
    r = await client.post("/v1/classify/conversation", content=body, headers={"content-type": "application/json"})
    r.raise_for_status()
    return [x["score"] for x in r.json()["results"]], len(body)


async def _per_turn(
    client: httpx.AsyncClient, messages: list[dict[str, str]], concurrent: bool
) -> tuple[list[float], int]:
    bodies = [json.dumps({"messages": messages[: k + 1]}).encode() for k in range(len(messages))]

    async def post(body: bytes) -> float:
        r = await client.post("/v1/classify", content=body, headers={"content-type": "application/json"})
        r.raise_for_status()
        return float(r.json()["score"])

    if concurrent:
        return list(await asyncio.gather(*(post(b) for b in bodies))), sum(len(b) for b in bodies)
    scores = [await post(b) for b in bodies]
    return scores, sum(len(b) for b in bodies)


async def measure(url: str, messages: list[dict[str, str]], rounds: int) -> dict[str, Any]:
    seconds: dict[str, list[float]] = {w: [] for w in WAYS}
    sent: dict[str, int] = {}
    scores: dict[str, list[float]] = {}
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for _ in range(rounds):
            for way in WAYS:
                started = time.perf_counter()
                if way == "conversation":
                    scores[way], sent[way] = await _one_call(client, messages)
                else:
                    scores[way], sent[way] = await _per_turn(client, messages, concurrent=way == "concurrent")
                seconds[way].append(time.perf_counter() - started)
    one = statistics.median(seconds["conversation"])
    return {
        way: {
            "median_s": round(statistics.median(s), 4),
            "min_s": round(min(s), 4),
            "ratio_to_one_call": round(statistics.median(s) / one, 2),
            "requests": 1 if way == "conversation" else len(messages),
            "request_bytes": sent[way],
            "max_abs_score_diff_vs_one_call": round(
                max(abs(a - b) for a, b in zip(scores[way], scores["conversation"], strict=True)), 6
            ),
        }
        for way, s in seconds.items()
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['turns']}-turn conversation, every turn judged ({report['variant'] or 'card default'} variant; "
        f"median of {report['rounds']} rounds)",
        "",
        "| way | requests | request bytes | median s | ratio to one call | max abs score diff |",
        "|---|---|---|---|---|---|",
    ]
    for way, row in report["ways"].items():
        lines.append(
            f"| {way} | {row['requests']} | {row['request_bytes']} | {row['median_s']:.3f} | "
            f"{row['ratio_to_one_call']:.2f} | {row['max_abs_score_diff_vs_one_call']:.2g} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench conversation") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="model directory (default: the bundled model)")
    p.add_argument("--variant", default=None, help="ONNX variant to serve (default: the card's for this machine)")
    p.add_argument("--data-dir", type=Path, default=None, help="datasets for the conversation's texts")
    p.add_argument("--turns", type=int, default=20, help="turns in the conversation (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each way, interleaved (default: %(default)s)")
    p.add_argument("--start-timeout-s", type=float, default=600.0, help="wait at most this long for /ready")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    args = p.parse_args(argv)
    if args.turns < 1 or args.rounds < 1:
        p.error("--turns and --rounds must be >= 1")
    messages, note = conversation(args.turns, args.data_dir)
    model_dir = args.model or default_model_dir()
    port = free_port()
    cmd = service_cmd(model_dir, port, args.variant)
    with running_server(cmd, service_env(), port, start_timeout_s=args.start_timeout_s) as server:
        ways = asyncio.run(measure(server.url, messages, args.rounds))
    report = {
        "benchmark": "conversation",
        "turns": args.turns,
        "rounds": args.rounds,
        "model_dir": model_dir.name,
        "variant": args.variant,
        "texts": note,
        "ways": ways,
    }
    emit_report(report, table(report), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
