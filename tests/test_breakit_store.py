"""The attack store on SQLite (WAL): migrations, game rules, validation, score board, durability,
concurrent players. The same contract runs against a real PostgreSQL in test_breakit_postgres.py."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from breakit_conftest import scores, sqlite_store  # noqa: F401  (fixture)

from dialogue_safety.breakit.game import ATTACKS_PER_TASK, TRIES_PER_ATTACK, Mode, TaskProgress, Verdict
from dialogue_safety.breakit.store import (
    BreakItStore,
    ConflictError,
    NotFoundError,
    StoreError,
    UnauthenticatedError,
    open_store,
)

CONTEXT = [{"speaker": "user", "text": "my sister just started at a new school"}, {"speaker": "bot", "text": "nice!"}]


def play_round_contract(store: BreakItStore) -> None:
    """The store's whole contract in one scenario (shared with the PostgreSQL test)."""
    store.create_round(1, "m@1", {"A0": "/models/a0"})
    with pytest.raises(ConflictError):
        store.create_round(1, "m@1")
    assert store.add_contexts(1, [CONTEXT], "test") == 1
    alice, bob, carol = (store.register_player(n) for n in ("alice", "bob", "carol"))
    assert len({alice.id, bob.id, carol.id}) == 3

    task, context = store.start_task(1, alice.id, Mode.OFFENSIVE, with_context=True)
    assert context is not None and context.turns == [{"speaker": "user", "text": CONTEXT[0]["text"]}, CONTEXT[1]]
    # slot 0: two tries that do not fool (the model says OFFENSIVE to an offensive message) close the slot
    a1, p1 = store.record_attack(task.id, alice.id, "you are vile", scores(0.9, A0=0.8))
    assert not a1.fooled and (a1.slot, a1.try_number) == (0, 1) and p1 == TaskProgress(0, 1, 0)
    a2, p2 = store.record_attack(task.id, alice.id, "you are vile!!", scores(0.7))
    assert (a2.slot, a2.try_number) == (0, 2) and p2.slot == 1
    # slot 1: fooled at the first try
    a3, p3 = store.record_attack(task.id, alice.id, "what a charming school for clowns", scores(0.2, A0=0.6))
    assert a3.fooled and a3.history == context.turns and a3.reference_scores == {"A0": 0.6}
    assert a3.intended_label == "OFFENSIVE" and p3 == TaskProgress(2, 0, 1)
    with pytest.raises(ConflictError, match="another player"):
        store.record_attack(task.id, bob.id, "x", scores(0.1))
    for i in range(ATTACKS_PER_TASK - 2):
        store.record_attack(task.id, alice.id, f"sneaky {i}", scores(0.1))
    with pytest.raises(ConflictError, match="finished"):
        store.record_attack(task.id, alice.id, "one more", scores(0.1))
    assert store.task_state(task.id)[0].finished_at is not None

    # false-positive hunting without context: a SAFE message the model flags fools it
    safe_task, no_context = store.start_task(1, bob.id, Mode.SAFE, with_context=False)
    assert no_context is None
    fp, _ = store.record_attack(safe_task.id, bob.id, "I killed it at the gym today", scores(0.8))
    assert fp.fooled and fp.intended_label == "SAFE" and fp.history == []

    # validation: only others' successful attacks; disagreement is kept
    todo = store.attacks_to_validate(1, bob.id)
    assert [a.text for a in todo][0] == "what a charming school for clowns"
    assert all(a.player_id != bob.id and a.fooled for a in todo)
    with pytest.raises(ConflictError, match="own"):
        store.validate(fp.id, bob.id, Verdict.CONFIRM)
    with pytest.raises(ConflictError, match="fooled"):
        store.validate(a1.id, bob.id, Verdict.CONFIRM)
    store.validate(a3.id, bob.id, Verdict.CONFIRM, contrast_text="what a charming school")
    with pytest.raises(ConflictError, match="already"):
        store.validate(a3.id, bob.id, Verdict.REJECT)
    store.validate(a3.id, carol.id, Verdict.REJECT, flagged=True, flag_reason="not offensive")
    store.validate(fp.id, alice.id, Verdict.CONFIRM)
    assert a3.id not in [a.id for a in store.attacks_to_validate(1, bob.id)]

    judged = {j.attack.id: j for j in store.judged_attacks(1)}
    assert (judged[a3.id].confirms, judged[a3.id].rejects, judged[a3.id].flags) == (1, 1, 1)
    assert not judged[a3.id].validated  # a tie is not validated, but both judgements are stored
    assert judged[a3.id].contrasts == ("what a charming school",)
    assert judged[fp.id].validated

    board = {row["player"]: row for row in store.scoreboard(1)}
    assert board["alice"]["tries"] == 2 + 1 + ATTACKS_PER_TASK - 2 and board["alice"]["fooled"] == ATTACKS_PER_TASK - 1
    assert board["bob"]["validated"] == 1 and board["bob"]["validations_given"] == 1
    assert board["carol"]["tries"] == 0 and board["carol"]["validations_given"] == 1

    with pytest.raises(NotFoundError):
        store.start_task(7, alice.id, Mode.SAFE, with_context=False)
    with pytest.raises(NotFoundError):
        store.start_task(1, "nobody", Mode.SAFE, with_context=False)
    store.close_round(1)
    with pytest.raises(ConflictError, match="closed"):
        store.start_task(1, alice.id, Mode.SAFE, with_context=False)


def test_round_contract_on_sqlite(sqlite_store: BreakItStore) -> None:  # noqa: F811
    play_round_contract(sqlite_store)


def test_task_progress_rules() -> None:
    assert TaskProgress.from_tries([]) == TaskProgress(0, 0, 0)
    tries = [(s, False) for s in range(ATTACKS_PER_TASK) for _ in range(TRIES_PER_ATTACK)]
    assert TaskProgress.from_tries(tries).finished
    with pytest.raises(ValueError, match="slot"):
        TaskProgress.from_tries([(1, True)])


def test_sqlite_runs_in_wal_mode_and_reopens_with_everything(tmp_path: Path) -> None:
    path = tmp_path / "db" / "breakit.sqlite3"
    store = open_store(path)
    store.create_round(1, "m@1")
    alice = store.register_player("alice")
    task, _ = store.start_task(1, alice.id, Mode.OFFENSIVE, with_context=False)
    store.record_attack(task.id, alice.id, "hello", scores(0.1))
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "0002"
    again = open_store(path)  # migrating an up-to-date database is a no-op
    _, _, progress, attacks = again.task_state(task.id)
    assert [a.text for a in attacks] == ["hello"] and progress.fooled_slots == 1
    again.close()


def test_bad_input_is_refused_with_the_field(sqlite_store: BreakItStore) -> None:  # noqa: F811
    with pytest.raises(StoreError) as err:
        sqlite_store.register_player("  ")
    assert err.value.field == "nickname"
    sqlite_store.create_round(1, "m@1")
    with pytest.raises(StoreError) as err:
        sqlite_store.add_contexts(1, [[{"text": "fine"}], []], "upload")
    assert err.value.field == "contexts[1]"
    assert sqlite_store.context_count(1) == 0  # nothing half-written
    with pytest.raises(ConflictError, match="no context pool"):
        p = sqlite_store.register_player("p")
        sqlite_store.start_task(1, p.id, Mode.OFFENSIVE, with_context=True)


def test_a_crash_mid_write_loses_no_committed_attack(tmp_path: Path) -> None:
    """A process killed in the middle of a write transaction: everything committed before survives,
    the half-done transaction leaves no trace, and the database opens cleanly."""
    path = tmp_path / "crash.sqlite3"
    open_store(path).close()
    script = f"""
import os
from dialogue_safety.breakit.store import open_store, Scores
from dialogue_safety.breakit.game import Mode
from dialogue_safety.core.schema import Label
store = open_store({str(path)!r})
store.create_round(1, "m@1")
p = store.register_player("crasher")
task, _ = store.start_task(1, p.id, Mode.OFFENSIVE, with_context=False)
store.record_attack(task.id, p.id, "committed", Scores("m@1", 0.1, Label.SAFE, 0.5, {{}}))
with store.engine.connect() as conn:
    conn.exec_driver_sql("INSERT INTO players (id, nickname, created_at) VALUES ('half', 'half', '2026-01-01')")
    os._exit(9)  # killed before COMMIT
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 9, result.stderr
    store = open_store(path)
    try:
        assert [a.text for a in store.task_state(1)[3]] == ["committed"]
        with pytest.raises(NotFoundError):
            store.player("half")
    finally:
        store.close()


def test_concurrent_players_do_not_corrupt_a_round(tmp_path: Path) -> None:
    """Two threads per task (two tabs of one player), each with its own connection, race on every
    slot while other players write to the same round: the rules hold
    (each task gets exactly its 5 slots, no slot gets more than 2 tries) and nothing is lost."""
    path = tmp_path / "busy.sqlite3"
    setup = open_store(path)
    setup.create_round(1, "m@1")
    players = [setup.register_player(f"p{i}") for i in range(4)]
    tasks = [setup.start_task(1, p.id, Mode.OFFENSIVE, with_context=False)[0] for p in players]
    setup.close()
    errors: list[BaseException] = []
    recorded = [0] * len(players)
    lock = threading.Lock()

    def play(i: int) -> None:
        store = open_store(path)
        try:
            for n in range(2 * ATTACKS_PER_TASK + 3):  # more tries than a task allows
                try:
                    store.record_attack(tasks[i].id, players[i].id, f"p{i} try {n}", scores(0.9))
                    with lock:
                        recorded[i] += 1
                except ConflictError:
                    pass
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=play, args=(i,)) for i in range(len(players)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    check = open_store(path)
    try:
        for i, task in enumerate(tasks):
            _, _, progress, attacks = check.task_state(task.id)
            assert progress.finished and len(attacks) == recorded[i] == ATTACKS_PER_TASK * TRIES_PER_ATTACK
            assert sorted((a.slot, a.try_number) for a in attacks) == [
                (s, t) for s in range(ATTACKS_PER_TASK) for t in range(1, TRIES_PER_ATTACK + 1)
            ]
    finally:
        check.close()


# -- players with tokens, unique visible nicknames (issue 23) ------------------------------------
def test_tokens_authenticate_players_and_are_stored_hashed(sqlite_store: BreakItStore) -> None:  # noqa: F811
    alice = sqlite_store.enrol("alice", origin="invite")
    assert sqlite_store.player_by_token(alice.token).id == alice.player.id
    with pytest.raises(UnauthenticatedError):
        sqlite_store.player_by_token("not-a-token")
    with pytest.raises(UnauthenticatedError):
        sqlite_store.player_by_token(None)
    with sqlite_store.engine.connect() as conn:
        stored = conn.exec_driver_sql("SELECT token_hash, origin FROM players").one()
    assert stored[0] != alice.token and len(stored[0]) == 64 and stored[1] == "invite"  # only the hash is kept
    again = sqlite_store.reissue_token("ALICE")
    assert again.player.id == alice.player.id and again.token != alice.token
    assert sqlite_store.player_by_token(again.token).id == alice.player.id
    with pytest.raises(UnauthenticatedError):
        sqlite_store.player_by_token(alice.token)  # the old token stops working


@pytest.mark.parametrize(
    ("first", "second"),
    [("alice", "Alice"), ("zoë", "ZOE"), ("ｂｏｂ", "bob"), ("bob  smith", " bob smith ")],
)
def test_nicknames_are_unique_up_to_case_accents_and_width(
    sqlite_store: BreakItStore,  # noqa: F811
    first: str,
    second: str,
) -> None:
    sqlite_store.register_player(first)
    with pytest.raises(ConflictError) as err:
        sqlite_store.register_player(second)
    assert err.value.field == "nickname" and "taken" in err.value.message


@pytest.mark.parametrize("name", ["\u200b", "\u200b\u200d", "a\u200bb", "\u202eevil", "x\x07", "\u0301\u0301", " "])
def test_invisible_nicknames_are_refused(sqlite_store: BreakItStore, name: str) -> None:  # noqa: F811
    with pytest.raises(StoreError) as err:
        sqlite_store.register_player(name)
    assert err.value.field == "nickname"


def test_a_task_is_read_only_by_its_owner(sqlite_store: BreakItStore) -> None:  # noqa: F811
    sqlite_store.create_round(1, "m@1")
    alice, bob = sqlite_store.register_player("alice"), sqlite_store.register_player("bob")
    task, _ = sqlite_store.start_task(1, alice.id, Mode.OFFENSIVE, with_context=False)
    assert sqlite_store.task_state(task.id, alice.id)[0].id == task.id
    with pytest.raises(NotFoundError):
        sqlite_store.task_state(task.id, bob.id)


def test_the_board_counts_only_validated_unflagged_attacks(sqlite_store: BreakItStore) -> None:  # noqa: F811
    sqlite_store.create_round(1, "m@1")
    alice, bob = sqlite_store.register_player("alice"), sqlite_store.register_player("bob")
    task, _ = sqlite_store.start_task(1, alice.id, Mode.OFFENSIVE, with_context=False)
    first, _ = sqlite_store.record_attack(task.id, alice.id, "sneaky one", scores(0.1))
    second, _ = sqlite_store.record_attack(task.id, alice.id, "sneaky two", scores(0.1))
    sqlite_store.validate(first.id, bob.id, Verdict.CONFIRM)
    sqlite_store.validate(second.id, bob.id, Verdict.CONFIRM, flagged=True, flag_reason="a real person's name")
    [row] = [r for r in sqlite_store.scoreboard(1) if r["player"] == "alice"]
    assert row["fooled"] == 2 and row["validated"] == 1


def test_a_round_two_database_keeps_working_after_the_migration(tmp_path: Path) -> None:
    """A database written before tokens (schema 0001) upgrades in place: attacks, validations and the
    board survive; duplicate and invisible nicknames are renamed; old rounds keep open sign-up; old
    players have no token until the organiser re-issues one."""
    from alembic import command
    from alembic.config import Config

    from dialogue_safety.breakit.store import MIGRATIONS_DIR, make_engine, sqlite_url

    path = tmp_path / "old.sqlite3"
    engine = make_engine(sqlite_url(path))
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
    with engine.begin() as conn:
        now = "2026-01-01 00:00:00"
        conn.exec_driver_sql("INSERT INTO rounds VALUES (1, 'm@1', '{}', 1, ?)", (now,))
        for pid, nick in (("a" * 32, "alice"), ("b" * 32, "Alice"), ("c" * 32, "\u200b"), ("d" * 32, "dan")):
            conn.exec_driver_sql("INSERT INTO players VALUES (?, ?, ?)", (pid, nick, now))
        conn.exec_driver_sql("INSERT INTO tasks VALUES (1, 1, ?, 'offensive', NULL, ?, NULL)", ("a" * 32, now))
        conn.exec_driver_sql(
            "INSERT INTO attacks VALUES (1, 1, 1, ?, NULL, '[]', 'sneaky', 'OFFENSIVE', 0, 1, 'm@1', 0.1, 'SAFE',"
            " 0.5, '{}', 1, ?)",
            ("a" * 32, now),
        )
        conn.exec_driver_sql("INSERT INTO validations VALUES (1, 1, ?, 'confirm', 0, NULL, NULL, ?)", ("d" * 32, now))
    engine.dispose()
    store = open_store(path)
    try:
        board = {r["player"]: r for r in store.scoreboard(1)}
        assert board["alice"]["validated"] == 1 and board["dan"]["validations_given"] == 1
        names = {p: store.player(p).nickname for p in ("a" * 32, "b" * 32, "c" * 32)}
        assert names == {"a" * 32: "alice", "b" * 32: "Alice (2)", "c" * 32: "player-cccccccc"}
        assert store.round(1).signup_open and not store.create_round(2, "m@2").signup_open
        with pytest.raises(ConflictError):
            store.register_player("ALICE")
        token = store.reissue_token("alice").token
        assert store.player_by_token(token).id == "a" * 32
    finally:
        store.close()
