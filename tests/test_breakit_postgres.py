"""The attack store against a real PostgreSQL server: a throwaway cluster (initdb + pg_ctl from
Debian's ``postgresql`` package) in a temporary directory, started for this module and stopped
after it. The same contract as on SQLite, concurrent players, and the service's break-it API on it.

Missing PostgreSQL binaries FAIL this test (they are a documented test dependency: ``apt-get
install postgresql``; ``scripts/test.sh`` installs them where it can). Run as root, the cluster
runs as the ``postgres`` system user (initdb refuses root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from breakit_conftest import scores
from service_conftest import FakeClassifier, live_server
from test_breakit_store import play_round_contract

from dialogue_safety.breakit.game import ATTACKS_PER_TASK, TRIES_PER_ATTACK, Mode
from dialogue_safety.breakit.store import ConflictError, open_store
from dialogue_safety.service.settings import ServiceSettings

pytestmark = pytest.mark.postgres  # needs PostgreSQL; scripts/test.sh installs it, no other test does

INSTALL_HINT = "install Debian's postgresql package (apt-get install postgresql) or put pg_ctl and initdb on PATH"


def postgres_bindir() -> Path:
    for candidate in [os.environ.get("PG_BINDIR", ""), *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]:
        if candidate and (Path(candidate) / "initdb").is_file() and (Path(candidate) / "pg_ctl").is_file():
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).resolve().parent
    pytest.fail(f"PostgreSQL binaries not found: {INSTALL_HINT}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    bindir = postgres_bindir()
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="breakit-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")  # Debian's package creates it
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()

    def run(*cmd: str) -> None:
        result = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"

    run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "breakit", "--no-sync", "-E", "UTF8")
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log"), "-w", "-t", "60", "start")
    try:
        yield f"postgresql://breakit@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _fresh_schema(url: str) -> None:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA public CASCADE")
        conn.exec_driver_sql("CREATE SCHEMA public")
    engine.dispose()


def test_round_contract_on_postgres(postgres_url: str) -> None:
    _fresh_schema(postgres_url)
    store = open_store(postgres_url)
    try:
        play_round_contract(store)
    finally:
        store.close()
    again = open_store(postgres_url)  # migrations are idempotent; everything is still there
    try:
        assert [r.number for r in again.rounds()] == [1]
        assert len(again.judged_attacks(1)) == ATTACKS_PER_TASK - 1 + 1
    finally:
        again.close()


def test_concurrent_tabs_on_postgres_keep_the_rules(postgres_url: str) -> None:
    _fresh_schema(postgres_url)
    setup = open_store(postgres_url)
    setup.create_round(1, "m@1")
    players = [setup.register_player(f"p{i}") for i in range(3)]
    tasks = [setup.start_task(1, p.id, Mode.OFFENSIVE, with_context=False)[0] for p in players]
    setup.close()
    errors: list[BaseException] = []

    def play(i: int) -> None:
        store = open_store(postgres_url)
        try:
            for n in range(2 * ATTACKS_PER_TASK + 3):
                with contextlib.suppress(ConflictError):
                    store.record_attack(tasks[i].id, players[i].id, f"try {n}", scores(0.9))
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
    check = open_store(postgres_url)
    try:
        for task in tasks:
            _, _, progress, attacks = check.task_state(task.id)
            assert progress.finished and len(attacks) == ATTACKS_PER_TASK * TRIES_PER_ATTACK
    finally:
        check.close()


def test_the_service_plays_on_postgres(postgres_url: str) -> None:
    _fresh_schema(postgres_url)
    settings = ServiceSettings(host="127.0.0.1", port=0, breakit_db=postgres_url, api_key="k")
    with live_server(settings, FakeClassifier()) as live, live.client() as c:
        assert c.post("/break-it/api/admin/rounds", json={"number": 1}, headers={"X-API-Key": "k"}).status_code == 200
        admin = {"X-API-Key": "k"}
        [pg] = c.post("/break-it/api/admin/players", json={"nicknames": ["pg"]}, headers=admin).json()["players"]
        me = {"X-Player-Token": pg["token"]}
        task = c.post("/break-it/api/tasks", json={"mode": "offensive", "with_context": False}, headers=me).json()
        r = c.post(f"/break-it/api/tasks/{task['task_id']}/attacks", json={"text": "so lovely"}, headers=me)
        assert r.status_code == 200 and r.json()["attack"]["fooled"] is True
        assert c.post("/break-it/api/admin/players", json={"nicknames": ["PG"]}, headers=admin).status_code == 409
        assert c.get("/break-it/api/scoreboard", headers=me).json()["players"][0]["fooled"] == 1
