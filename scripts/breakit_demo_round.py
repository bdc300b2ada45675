"""Play the demo break-it round (docs/breakit-demo/round-1.md) through the service's break-it JSON API (the page's API).

The demo round (docs/breakit-demo/round-1.jsonl) was played by hand with the subcommands below,
one HTTP call each; ``dump`` turns the session's log into the committed file and ``replay`` plays
that file again against a running service, so a reader can rebuild the round:

    export SAFETY_BREAKIT_DB=runs/replay.sqlite3 SAFETY_API_KEY=change-me
    dialogue-safety break-it new-round --round 1 --model models/default --reference A0=models/default \\
        --pool-source diasafety --pool-source convabuse --data-dir ../shared/data --pool-size 150 --seed 11 \\
        --all-contexts --rate try:player=1000/minute --rate try:address=1000/minute \\
        --rate validate:player=1000/minute --rate validate:address=1000/minute   # a replay is not typed by people
    dialogue-safety serve --port 8000 &
    python scripts/breakit_demo_round.py --url http://127.0.0.1:8000 replay docs/breakit-demo/round-1.jsonl
    dialogue-safety break-it export --round 1 runs/rounds

The file names each task's context by source and a fingerprint of its turns, not by its text (the
contexts are dataset excerpts, which stay out of the repository): the new-round command above
draws the same pool from the data directory, and ``replay`` starts tasks until the game hands out
the context a recorded task had (the game draws contexts at random), then submits the recorded
tries in order and the recorded validations, and reports any try whose outcome (fooled or not)
differs from the recording. Players are invited through the admin endpoint (``SAFETY_API_KEY``)
and act with their tokens; a 429 (the round's rate limits) is waited out and retried. Players get
fresh random ids, so the export's attacker -> split draw
differs from the demo's; each task records the split its attacker had in the demo
(``exported_split``).

Playing by hand (what produced the file; the session log is runs/breakit-demo/session.jsonl):

    python scripts/breakit_demo_round.py register NICK...            # invited players (needs SAFETY_API_KEY)
    python scripts/breakit_demo_round.py task NICK offensive|safe [--no-context]   # prints the context
    python scripts/breakit_demo_round.py try NICK TASK_ID "message"   # one try: scores, fooled?
    python scripts/breakit_demo_round.py todo NICK                    # others' attacks to validate
    python scripts/breakit_demo_round.py judge NICK ATTACK_ID confirm|reject [--contrast TEXT] [--flag WHY]
    python scripts/breakit_demo_round.py dump docs/breakit-demo/round-1.jsonl --split-from runs/rounds/breakit/round-1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

STATE = Path("runs/breakit-demo")
LOG = STATE / "session.jsonl"
PLAYERS = STATE / "players.json"


def _client(url: str) -> httpx.Client:
    return httpx.Client(base_url=url.rstrip("/") + "/break-it/api", timeout=60.0)


def _call(
    client: httpx.Client, method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None
) -> dict[str, Any]:
    headers = {"X-Player-Token": token} if token else {}
    if path.startswith("/admin/"):
        headers["X-API-Key"] = os.environ.get("SAFETY_API_KEY", "")
    response = client.request(method, path, json=body, headers=headers)
    while response.status_code == 429 and "Retry-After" in response.headers:  # the round's rate limits
        time.sleep(int(response.headers["Retry-After"]))
        response = client.request(method, path, json=body, headers=headers)
    if response.status_code >= 400:
        raise SystemExit(f"{method} {path}: {response.status_code} {response.text}")
    out: dict[str, Any] = response.json()
    return out


def _log(event: dict[str, Any]) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(LOG, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"at": datetime.now(UTC).isoformat(), **event}, ensure_ascii=False) + "\n")


def _players() -> dict[str, dict[str, str]]:
    """nickname -> {"player_id", "token"}."""
    return json.loads(PLAYERS.read_text()) if PLAYERS.exists() else {}


def _token(nick: str) -> str:
    players = _players()
    if nick not in players:
        raise SystemExit(f"unknown player {nick!r}; register it first")
    return players[nick]["token"]


def _invite(client: httpx.Client, nicks: list[str]) -> dict[str, dict[str, str]]:
    invited = _call(client, "POST", "/admin/players", {"nicknames": nicks})["players"]
    return {p["nickname"]: {"player_id": p["player_id"], "token": p["token"]} for p in invited}


def cmd_register(args: argparse.Namespace, client: httpx.Client) -> None:
    players = _players()
    new = [nick for nick in args.nicks if nick not in players]
    if new:
        players |= _invite(client, new)
        for nick in new:
            _log({"event": "player", "nick": nick, "player_id": players[nick]["player_id"]})
    STATE.mkdir(parents=True, exist_ok=True)
    PLAYERS.write_text(json.dumps(players, indent=2) + "\n")
    print(json.dumps({nick: p["player_id"] for nick, p in players.items()}, indent=2))


def cmd_task(args: argparse.Namespace, client: httpx.Client) -> None:
    body = {"mode": args.mode, "with_context": not args.no_context}
    task = _call(client, "POST", "/tasks", body, _token(args.nick))
    _log({"event": "task", "nick": args.nick, **task})
    print(f"task {task['task_id']} ({args.nick}, {args.mode}) intended {task['intended']}")
    for turn in (task["context"] or {}).get("turns", []):
        print(f"  [{turn.get('speaker')}] {turn['text']}")


def _show_try(nick: str, out: dict[str, Any]) -> None:
    a, p = out["attack"], out["progress"]
    refs = " ".join(f"{k}={v:.3f}" for k, v in sorted(a["reference_scores"].items()))
    print(
        f"attack {a['id']} {nick} slot {a['slot']} try {a['try']}: score {a['score']:.3f} ({a['label']}, "
        f"threshold {a['threshold']}) {refs} -> {'FOOLED' if a['fooled'] else 'not fooled'}; "
        f"task slot {p['slot']} fooled {p['fooled']}{' finished' if p['finished'] else ''}"
    )


def cmd_try(args: argparse.Namespace, client: httpx.Client) -> None:
    out = _call(client, "POST", f"/tasks/{args.task}/attacks", {"text": args.text}, _token(args.nick))
    _log({"event": "try", "nick": args.nick, "task_id": args.task, **out})
    _show_try(args.nick, out)


def cmd_todo(args: argparse.Namespace, client: httpx.Client) -> None:
    out = _call(client, "GET", "/validations/todo?limit=100", token=_token(args.nick))
    for a in out["attacks"]:
        context = " | ".join(t["text"] for t in a["history"][-2:])
        print(f"{a['id']} intended {a['intended']} score {a['score']:.3f}: {a['text']!r}  <- ...{context[-160:]!r}")


def cmd_judge(args: argparse.Namespace, client: httpx.Client) -> None:
    body: dict[str, Any] = {"verdict": args.verdict}
    if args.flag:
        body |= {"flagged": True, "flag_reason": args.flag}
    if args.contrast:
        body["contrast_text"] = args.contrast
    out = _call(client, "POST", f"/attacks/{args.attack}/validations", body, _token(args.nick))
    _log({"event": "judge", "nick": args.nick, "request": body, **out})
    print(out)


def _session(log: Path) -> list[dict[str, Any]]:
    """The recorded tasks in order, each with its tries and their validations (by nickname)."""
    tasks: dict[int, dict[str, Any]] = {}
    by_attack: dict[int, dict[str, Any]] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        e = json.loads(line)
        if e["event"] == "task":
            tasks[e["task_id"]] = {
                "task": len(tasks) + 1,
                "attacker": e["nick"],
                "mode": e["mode"],
                "context": e["context"],
                "tries": [],
            }
        elif e["event"] == "try":
            a = e["attack"]
            t = {
                "text": a["text"],
                "slot": a["slot"],
                "try": a["try"],
                "recorded": {"model": a["model"], "score": round(a["score"], 4), "fooled": a["fooled"]}
                | {k: round(v, 4) for k, v in sorted(a["reference_scores"].items())},
                "validations": [],
            }
            tasks[e["task_id"]]["tries"].append(t)
            by_attack[a["id"]] = t
        elif e["event"] == "judge":
            r = e["request"]
            v = {"validator": e["nick"], "verdict": r["verdict"]}
            if r.get("flagged"):
                v["flag_reason"] = r.get("flag_reason")
            if r.get("contrast_text"):
                v["contrast"] = r["contrast_text"]
            by_attack[e["attack_id"]]["validations"].append(v)
    return [t for t in tasks.values() if t["tries"]]


def context_key(turns: list[dict[str, Any]]) -> str:
    """A context's fingerprint: the committed file names contexts by source and fingerprint, never by
    their text (they are dataset excerpts, and datasets stay out of the repository)."""
    return hashlib.sha256(json.dumps(turns, ensure_ascii=False, sort_keys=True).encode()).hexdigest()[:16]


def cmd_dump(args: argparse.Namespace, _client: httpx.Client) -> None:
    tasks = _session(LOG)
    split_of = {}  # nickname -> the split 'break-it export' put the attacker in
    if args.split_from:
        ids = {v["player_id"]: k for k, v in _players().items()}
        for path in Path(args.split_from).glob("*.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                split_of[ids[json.loads(line)["attacker"]]] = path.stem
    for t in tasks:
        if t["attacker"] in split_of:
            t["exported_split"] = split_of[t["attacker"]]
        if t["context"] is not None:
            t["context"] = {"source": t["context"]["source"], "key": context_key(t["context"]["turns"])}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for t in tasks:
            handle.write(json.dumps(t, ensure_ascii=False) + "\n")
    tries = sum(len(t["tries"]) for t in tasks)
    contexts = len({t["context"]["key"] for t in tasks if t["context"]})
    print(f"{len(tasks)} tasks, {tries} tries, {contexts} contexts -> {out}")


def cmd_replay(args: argparse.Namespace, client: httpx.Client) -> None:
    tasks = [json.loads(line) for line in Path(args.file).read_text(encoding="utf-8").splitlines() if line]
    nicks = {t["attacker"] for t in tasks}
    nicks |= {v["validator"] for t in tasks for x in t["tries"] for v in x["validations"]}
    tokens = {n: p["token"] for n, p in _invite(client, sorted(nicks)).items()}
    fooled: list[tuple[int, dict[str, Any]]] = []
    differ = 0
    for t in tasks:
        want = t["context"] and t["context"]["key"]
        player = tokens[t["attacker"]]
        body = {"mode": t["mode"], "with_context": bool(want)}
        for _ in range(args.max_draws):
            task = _call(client, "POST", "/tasks", body, player)
            if not want or context_key(task["context"]["turns"]) == want:
                break
        else:
            raise SystemExit(f"task {t['task']}: the pool never handed out its context in {args.max_draws} draws")
        for x in t["tries"]:
            a = _call(client, "POST", f"/tasks/{task['task_id']}/attacks", {"text": x["text"]}, player)["attack"]
            if a["fooled"] != x["recorded"]["fooled"]:
                differ += 1
                print(
                    f"task {t['task']}: {x['text']!r}: fooled={a['fooled']}, score {a['score']:.3f}",
                    f"(recorded {x['recorded']})",
                )
            if a["fooled"]:
                fooled.append((a["id"], x))
    for attack_id, x in fooled:
        for v in x["validations"]:
            judgement: dict[str, Any] = {"verdict": v["verdict"]}
            if v.get("flag_reason"):
                judgement |= {"flagged": True, "flag_reason": v["flag_reason"]}
            if v.get("contrast"):
                judgement["contrast_text"] = v["contrast"]
            _call(client, "POST", f"/attacks/{attack_id}/validations", judgement, tokens[v["validator"]])
    board = _call(client, "GET", "/scoreboard", token=next(iter(tokens.values())))["players"]
    print(json.dumps({"tasks": len(tasks), "tries_differing_from_recording": differ, "scoreboard": board}, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the service (with SAFETY_BREAKIT_DB set)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("register")
    p.add_argument("nicks", nargs="+")
    p = sub.add_parser("task")
    p.add_argument("nick")
    p.add_argument("mode", choices=["offensive", "safe"])
    p.add_argument("--no-context", action="store_true")
    p = sub.add_parser("try")
    p.add_argument("nick")
    p.add_argument("task", type=int)
    p.add_argument("text")
    p = sub.add_parser("todo")
    p.add_argument("nick")
    p = sub.add_parser("judge")
    p.add_argument("nick")
    p.add_argument("attack", type=int)
    p.add_argument("verdict", choices=["confirm", "reject"])
    p.add_argument("--contrast")
    p.add_argument("--flag")
    p = sub.add_parser("dump")
    p.add_argument("out")
    p.add_argument("--split-from", help="the exported round (OUT/breakit/round-N): note each attacker's split")
    p = sub.add_parser("replay")
    p.add_argument("file")
    p.add_argument("--max-draws", type=int, default=2000, help="tasks drawn per recorded task to meet its context")
    args = parser.parse_args(argv)
    with _client(args.url) as client:
        globals()[f"cmd_{args.command}"](args, client)


if __name__ == "__main__":
    sys.exit(main())
