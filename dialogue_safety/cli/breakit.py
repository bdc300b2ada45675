"""``dialogue-safety break-it <command>``: run the break-it game's rounds from the command line.

* ``new-round``: open round N against a model (its card names the model under attack), with the
  earlier models of the loop as references (``--reference A0=DIR``) and a context pool drawn from
  the training sources' train splits (``--pool-source``) or read from a file (``--pool``);
* ``invite NICK...``: one secret token (and invite link) per player; ``--reissue`` gives an
  existing player (one from before tokens, or one who lost theirs) a new token;
* ``configure --round N``: open or close a round's sign-up, set its rate limits;
* ``add-contexts``: add contexts to a round's pool;
* ``export --round N OUT``: write round N's validated attacks as the ``breakit`` source under the
  data directory OUT (``OUT/breakit/round-N/``; format in ``dialogue_safety/sources/breakit.py``);
* ``status``: rounds, pools and the score board.

The database is ``--db`` (an SQLite file or a URL), else ``$SAFETY_BREAKIT_DB``: the same one the
service plays on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DB_ENV = "SAFETY_BREAKIT_DB"


def build_parser(prog: str) -> argparse.ArgumentParser:
    from dialogue_safety.breakit.pool import POOL_SOURCES

    p = argparse.ArgumentParser(prog=prog, description="Run the break-it game's rounds (see docs/breakit.md).")
    commands = p.add_subparsers(dest="command", required=True)

    def with_db(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument(
            "--db", default=os.environ.get(DB_ENV), help=f"SQLite file or database URL (default: ${DB_ENV})"
        )
        return sub

    def with_rounds(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--signup",
            choices=("open", "closed"),
            default=None,
            help="open: anyone may register on the page; closed (new rounds' default): invited players only",
        )
        sub.add_argument(
            "--rate",
            action="append",
            default=[],
            metavar="ACTION:SCOPE=LIMITS",
            help="a rate limit overriding the default, e.g. try:player=10/minute or score:address='5/second;100/minute'"
            " "
            "(actions: register, task, score, try, validate; scopes: player, address; repeatable)",
        )

    def with_pool(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--pool", type=Path, help="JSON-lines file of contexts (each a list of turns)")
        sub.add_argument(
            "--pool-source",
            action="append",
            default=[],
            choices=POOL_SOURCES,
            help="draw safe conversations from this source's train split (repeatable)",
        )
        sub.add_argument("--pool-size", type=int, default=500, help="contexts drawn from the sources (default 500)")
        sub.add_argument("--data-dir", help="the data directory for --pool-source")
        sub.add_argument("--seed", type=int, default=0)
        sub.add_argument(
            "--all-contexts",
            action="store_true",
            help="keep contexts that are not conversations (placeholder turns, too short); default: drop them",
        )
        sub.add_argument(
            "--screen-model",
            type=Path,
            help="drop pool contexts in which this model flags any turn (new-round: default --model; 'none': keep all)",
        )

    new = with_db(commands.add_parser("new-round", help="open a round against a model"))
    new.add_argument("--round", type=int, required=True, dest="number")
    new.add_argument("--model", type=Path, required=True, help="the model directory under attack (its card names it)")
    new.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="ROLE=DIR",
        help="an earlier model of the loop scored alongside, e.g. A0=models/a0 (repeatable)",
    )
    with_rounds(new)
    with_pool(new)
    invite = with_db(commands.add_parser("invite", help="issue a secret token (an invite link) per player"))
    invite.add_argument("nicknames", nargs="+", help="the players' nicknames (unique, shown on the score board)")
    invite.add_argument(
        "--reissue", action="store_true", help="new tokens for existing players (old ones stop working)"
    )
    invite.add_argument("--url", default="http://localhost:8000", help="the service's address, for the invite links")
    configure = with_db(commands.add_parser("configure", help="open or close a round's sign-up; set its rate limits"))
    configure.add_argument("--round", type=int, required=True, dest="number")
    with_rounds(configure)
    configure.add_argument("--default-rates", action="store_true", help="drop the round's rate overrides")
    add = with_db(commands.add_parser("add-contexts", help="add contexts to a round's pool"))
    add.add_argument("--round", type=int, required=True, dest="number")
    with_pool(add)
    export = with_db(commands.add_parser("export", help="write a round's validated attacks as a dataset source"))
    export.add_argument("--round", type=int, required=True, dest="number")
    export.add_argument("out", type=Path, help="a data directory: writes OUT/breakit/round-N/")
    status = with_db(commands.add_parser("status", help="rounds, pools and score boards"))
    status.add_argument("--round", type=int, dest="number")
    return p


def screen_pool(pool: list[Any], model_dir: Path) -> list[Any]:
    """The contexts in which the model flags no turn (each turn judged after the turns before it):
    the sources' SAFE labels cover the last turn only, and a pool should hold safe conversations."""
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.schema import Example, Label, Turn

    classifier = OnnxClassifier(model_dir)
    examples, owner = [], []
    for i, turns in enumerate(pool):
        history = [Turn(t["text"], t.get("speaker")) for t in turns]
        for k in range(len(history)):
            examples.append(Example(utterance=history[k].text, history=tuple(history[:k])))
            owner.append(i)
    flagged = {owner[j] for j, p in enumerate(classifier.predict(examples)) if p.label is Label.OFFENSIVE}
    return [turns for i, turns in enumerate(pool) if i not in flagged]


def _pool(args: argparse.Namespace, default_screen: Path | None = None) -> list[tuple[str, list[Any]]]:
    from dialogue_safety.breakit.pool import is_conversation, read_pool, safe_contexts

    pools: list[tuple[str, list[Any]]] = []
    if args.pool is not None:
        contexts = read_pool(args.pool)
        kept = [c for c in contexts if args.all_contexts or is_conversation(c)]
        if len(kept) < len(contexts):
            print(
                f"{args.pool}: {len(contexts) - len(kept)} contexts are not conversations (too short or "
                "placeholder turns such as 'ok' / 'restart Hey'); left out",
                file=sys.stderr,
            )
        pools.append((f"file:{args.pool.name}", kept))
    for name in args.pool_source:
        drawn = safe_contexts(
            [name], args.data_dir, args.pool_size, args.seed, conversations_only=not args.all_contexts
        )
        pools.append((name, drawn))
    screen = args.screen_model if args.screen_model is not None else default_screen
    if screen is not None and str(screen) != "none":
        pools = [(source, screen_pool(pool, screen)) for source, pool in pools]
    return pools


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety break-it") -> int:
    args = build_parser(prog).parse_args(argv)
    if not args.db:
        print(f"{prog}: no database: pass --db FILE_OR_URL or set ${DB_ENV}", file=sys.stderr)
        return 2
    from dialogue_safety.breakit.export import export_round
    from dialogue_safety.breakit.rates import parse_rate_option
    from dialogue_safety.breakit.store import StoreError, open_store
    from dialogue_safety.core.errors import InvalidInput
    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.sources.errors import DatasetFormatError, SourceUnavailableError

    local = args.db.removeprefix("sqlite:///") if args.db.startswith("sqlite:///") else args.db
    if "://" not in local and args.command in ("status", "export") and not Path(local).is_file():
        print(f"{prog}: no break-it database at {args.db} (it is made by new-round)", file=sys.stderr)
        return 2
    try:
        store = open_store(args.db)
        store.rounds()  # a file that is no database, or a server that does not answer, fails here: one line
    except Exception as exc:  # noqa: BLE001  (SQLAlchemy's and the drivers' errors: what to fix is in the message)
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        print(f"{prog}: cannot open the break-it database {args.db}: {reason}", file=sys.stderr)
        return 2
    try:
        if args.command == "new-round":
            references = {}
            for item in args.reference:
                role, sep, directory = item.partition("=")
                if not sep or not role or not directory:
                    print(f"{prog}: --reference {item!r}: expected ROLE=DIR, e.g. A0=models/a0", file=sys.stderr)
                    return 2
                ModelCard.load(directory)  # a reference must be a model directory
                references[role] = str(Path(directory).resolve())
            card = ModelCard.load(args.model)
            rates = parse_rate_option(args.rate)
            pools = _pool(args, default_screen=args.model)
            store.create_round(args.number, card.model_id, references, signup_open=args.signup == "open", rates=rates)
            added = {source: store.add_contexts(args.number, pool, source) for source, pool in pools}
            print(
                json.dumps({"round": args.number, "model": card.model_id, "references": references, "contexts": added})
            )
        elif args.command == "invite":
            enrol = store.reissue_token if args.reissue else (lambda nick: store.enrol(nick, origin="invite"))
            for nickname in args.nicknames:
                e = enrol(nickname)
                link = f"{args.url.rstrip('/')}/break-it#token={e.token}"
                print(json.dumps({"nickname": e.player.nickname, "token": e.token, "link": link}))
        elif args.command == "configure":
            new_rates = {} if args.default_rates else (parse_rate_option(args.rate) if args.rate else None)
            signup = None if args.signup is None else args.signup == "open"
            rnd = store.configure_round(args.number, signup_open=signup, rates=new_rates)
            print(json.dumps({"round": rnd.number, "signup_open": rnd.signup_open, "rates": rnd.rates or {}}))
        elif args.command == "add-contexts":
            added = {source: store.add_contexts(args.number, pool, source) for source, pool in _pool(args)}
            print(json.dumps({"round": args.number, "contexts": added, "total": store.context_count(args.number)}))
        elif args.command == "export":
            summary = export_round(store, args.number, args.out)
            print(json.dumps(summary.as_json(), indent=2))
        elif args.command == "status":
            rounds = [r for r in store.rounds() if args.number is None or r.number == args.number]
            for r in rounds:
                print(
                    json.dumps(
                        {
                            "round": r.number,
                            "model": r.model_id,
                            "open": r.open,
                            "signup_open": r.signup_open,
                            "rates": r.rates or {},
                            "references": r.references,
                            "contexts": store.context_count(r.number),
                            "scoreboard": store.scoreboard(r.number),
                        }
                    )
                )
    except (StoreError, DatasetFormatError, SourceUnavailableError, FileNotFoundError, ValueError, InvalidInput) as exc:
        print(f"{prog}: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
