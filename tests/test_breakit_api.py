"""The break-it JSON API over real HTTP (uvicorn), scored through the service's batcher by the fake
classifier (a bad word scores 0.9, else 0.1), stored in a temporary SQLite file.

Players authenticate with the token the organiser issued (``X-Player-Token``); every player
endpoint refuses a request without one (401); sign-up works only where the round allows it; a
second player cannot read a task or validate as someone else; rate limits answer 429 with
``Retry-After``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_conftest import FakeClassifier, LiveServer, live_server

from dialogue_safety.breakit.game import ATTACKS_PER_TASK
from dialogue_safety.cli.breakit import main as breakit_cli
from dialogue_safety.service.settings import ServiceSettings

KEY = "test-admin-key"
ADMIN = {"Authorization": f"Bearer {KEY}"}
CONTEXT = [{"speaker": "user", "text": "I just adopted a cat"}, {"speaker": "bot", "text": "what is its name?"}]
GENEROUS = {"score": {"player": "1000/minute"}, "try": {"player": "1000/minute"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    db = tmp_path_factory.mktemp("breakit") / "game.sqlite3"
    settings = ServiceSettings(host="127.0.0.1", port=0, breakit_db=str(db), api_key=KEY, max_wait_ms=0.5)
    with live_server(settings, FakeClassifier()) as live:
        live.extra["db"] = db
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def invite(client: httpx.Client, *names: str) -> list[dict[str, str]]:
    r = client.post("/break-it/api/admin/players", json={"nicknames": list(names)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    players: list[dict[str, str]] = r.json()["players"]
    return players


def auth(player: dict[str, str]) -> dict[str, str]:
    return {"X-Player-Token": player["token"]}


def test_admin_endpoints_need_the_api_key(client: httpx.Client) -> None:
    r = client.post("/break-it/api/admin/rounds", json={"number": 1})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert client.post("/break-it/api/admin/players", json={"nicknames": ["x"]}).status_code == 401
    assert client.get("/break-it/api/round").status_code == 404  # no round yet: a clear 404
    body = {"number": 1, "references": {"A0": "models/a0"}, "rates": GENEROUS}
    r = client.post("/break-it/api/admin/rounds", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "fake@1.2.3" and r.json()["references"] == ["A0"] and not r.json()["signup_open"]
    assert r.json()["rates"]["try"]["player"] == "1000/minute" and r.json()["rates"]["try"]["address"] == "30/minute"
    r = client.post("/break-it/api/admin/rounds", json={"number": 1}, headers=ADMIN)
    assert r.status_code == 409 and r.json()["error"]["field"] == "number"
    r = client.post("/break-it/api/admin/rounds/1/contexts", json={"contexts": [CONTEXT]}, headers=ADMIN)
    assert r.json() == {"round": 1, "added": 1, "contexts": 1}
    r = client.post("/break-it/api/admin/rounds/1/contexts", json={"contexts": [[{"text": ""}]]}, headers=ADMIN)
    assert r.status_code == 422 and "contexts[0][0].text" in r.json()["error"]["field"]
    r = client.post("/break-it/api/admin/rounds/1/settings", json={"rates": {"try": {"player": "fast"}}}, headers=ADMIN)
    assert r.status_code == 422 and r.json()["error"]["field"] == "rates"


def test_every_player_endpoint_needs_a_valid_token(client: httpx.Client) -> None:
    calls = [
        ("GET", "/break-it/api/players/me", None),
        ("POST", "/break-it/api/tasks", {"mode": "offensive"}),
        ("GET", "/break-it/api/tasks/1", None),
        ("POST", "/break-it/api/score", {"utterance": "hello"}),
        ("POST", "/break-it/api/tasks/1/attacks", {"text": "hello"}),
        ("GET", "/break-it/api/validations/todo", None),
        ("POST", "/break-it/api/attacks/1/validations", {"verdict": "confirm"}),
        ("GET", "/break-it/api/scoreboard", None),
    ]
    for method, path, body in calls:
        for headers in ({}, {"X-Player-Token": "forged"}):
            r = client.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["code"] == "invalid_player_token" and r.headers["WWW-Authenticate"]
    # the one open read: the round (the page shows sign-up or not before anyone joins; no player data)
    assert client.get("/break-it/api/round").status_code == 200


def test_sign_up_only_where_the_organiser_opened_it(client: httpx.Client, server: LiveServer) -> None:
    r = client.post("/break-it/api/players", json={"nickname": "mallory"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert breakit_cli(["configure", "--db", str(server.extra["db"]), "--round", "1", "--signup", "open"]) == 0
    r = client.post("/break-it/api/players", json={"nickname": "mallory"})
    assert r.status_code == 200 and r.json()["token"]
    me = client.get("/break-it/api/players/me", headers=auth(r.json())).json()
    assert me == {"player_id": r.json()["player_id"], "nickname": "mallory"}
    for name in ("Mallory", "\u200b", "mal\u200dlory"):
        r = client.post("/break-it/api/players", json={"nickname": name})
        assert r.status_code in (409, 422) and r.json()["error"]["field"] == "nickname", name
    assert breakit_cli(["configure", "--db", str(server.extra["db"]), "--round", "1", "--signup", "closed"]) == 0
    assert client.post("/break-it/api/players", json={"nickname": "trudy"}).status_code == 403


def test_play_a_task_validate_and_score_board(client: httpx.Client) -> None:
    round_ = client.get("/break-it/api/round").json()
    assert round_["number"] == 1 and round_["deployed"] == "fake@1.2.3" and round_["contexts"] == 1
    assert round_["rules"] == {"attacks_per_task": 5, "tries_per_attack": 2}
    alice, bob = invite(client, "alice", "bob")

    task = client.post("/break-it/api/tasks", json={"mode": "offensive"}, headers=auth(alice)).json()
    assert task["context"]["turns"] == CONTEXT and task["intended"] == "OFFENSIVE"
    live = client.post(
        "/break-it/api/score", json={"history": CONTEXT, "utterance": "you idiot"}, headers=auth(alice)
    ).json()
    assert live["label"] == "OFFENSIVE" and live["score"] == pytest.approx(0.9) and "explanation" not in live
    explained = client.post(
        "/break-it/api/score",
        json={"history": CONTEXT, "utterance": "you idiot", "explain": True},
        headers=auth(alice),
    ).json()
    ex = explained["explanation"]
    assert explained["score"] == pytest.approx(0.9) and ex["method"] == "shapley"
    assert [w["contribution"] for w in ex["utterance"]] == pytest.approx([0.0, 0.8], abs=1e-4)  # 11 words: sampled
    assert [len(t) for t in ex["history"]] == [5, 4]  # the context's words are explained too

    url = f"/break-it/api/tasks/{task['task_id']}/attacks"
    held = client.post(url, json={"text": "you idiot"}, headers=auth(alice)).json()
    assert not held["attack"]["fooled"] and held["progress"] == {
        "slot": 0,
        "tries_in_slot": 1,
        "fooled": 0,
        "finished": False,
    }
    fooled = client.post(url, json={"text": "what a dumb name for a cat"}, headers=auth(alice)).json()
    attack = fooled["attack"]
    assert attack["fooled"] and attack["label"] == "SAFE" and attack["history"] == CONTEXT
    assert attack["model"] == "fake@1.2.3" and set(attack["reference_scores"]) == {"A0"}
    assert fooled["progress"]["slot"] == 1
    r = client.post(url, json={"text": "not mine"}, headers=auth(bob))
    assert r.status_code == 404 and r.json()["error"]["field"] == "task_id"  # bob cannot see alice's task
    assert client.get(f"/break-it/api/tasks/{task['task_id']}", headers=auth(bob)).status_code == 404
    r = client.post(url, json={"player_id": bob["player_id"], "text": "old clients"}, headers=auth(alice))
    assert r.status_code == 422 and r.json()["error"]["field"] == "player_id"  # who you are comes from the token
    for i in range(ATTACKS_PER_TASK - 1):
        client.post(url, json={"text": f"sneaky insult {i}"}, headers=auth(alice))
    r = client.post(url, json={"text": "one too many"}, headers=auth(alice))
    assert r.status_code == 409 and "finished" in r.json()["error"]["message"]
    state = client.get(f"/break-it/api/tasks/{task['task_id']}", headers=auth(alice)).json()
    assert state["progress"]["finished"] and len(state["attacks"]) == ATTACKS_PER_TASK + 1

    todo = client.get("/break-it/api/validations/todo", headers=auth(bob)).json()["attacks"]
    assert todo[0]["id"] == attack["id"] and all(a["fooled"] for a in todo)
    assert client.get("/break-it/api/validations/todo", headers=auth(alice)).json()["attacks"] == []
    body = {"verdict": "confirm", "contrast_text": "what a sweet name for a cat"}
    r = client.post(f"/break-it/api/attacks/{attack['id']}/validations", json=body, headers=auth(bob))
    assert r.status_code == 200 and r.json()["verdict"] == "confirm"
    r = client.post(
        f"/break-it/api/attacks/{attack['id']}/validations", json={"verdict": "confirm"}, headers=auth(alice)
    )
    assert r.status_code == 409  # not your own
    flagged = todo[1]["id"]
    body = {"verdict": "confirm", "flagged": True, "flag_reason": "names a real person"}
    assert client.post(f"/break-it/api/attacks/{flagged}/validations", json=body, headers=auth(bob)).status_code == 200

    board = {p["player"]: p for p in client.get("/break-it/api/scoreboard", headers=auth(bob)).json()["players"]}
    assert board["alice"]["validated"] == 1 and board["alice"]["tries"] == ATTACKS_PER_TASK + 1  # flagged: not counted
    assert board["bob"]["validations_given"] == 2


def test_bad_requests_get_a_clear_4xx(client: httpx.Client) -> None:
    [carol] = invite(client, "carol")
    r = client.post("/break-it/api/tasks", json={"mode": "rude"}, headers=auth(carol))
    assert r.status_code == 422 and r.json()["error"]["field"] == "mode"
    assert client.get("/break-it/api/tasks/999999", headers=auth(carol)).status_code == 404
    r = client.post("/break-it/api/attacks/1/validations", json={"verdict": "maybe"}, headers=auth(carol))
    assert r.status_code == 422 and r.json()["error"]["field"] == "verdict"
    task = client.post("/break-it/api/tasks", json={"mode": "safe", "with_context": False}, headers=auth(carol)).json()
    r = client.post(f"/break-it/api/tasks/{task['task_id']}/attacks", json={"text": "x" * 4001}, headers=auth(carol))
    assert r.status_code == 422 and r.json()["error"] == {
        "code": "utterance_too_long",
        "message": "the text has 4001 characters; at most 4000 are accepted (SAFETY_MAX_UTTERANCE_CHARS)",
        "field": "text",
    }
    assert client.get(f"/break-it/api/tasks/{task['task_id']}", headers=auth(carol)).json()["attacks"] == []
    r = client.post("/break-it/api/score", json={"utterance": "  "}, headers=auth(carol))
    assert r.status_code == 422 and r.json()["error"]["code"] == "empty_utterance"
    r = client.post("/break-it/api/admin/players", json={"nicknames": ["carol"]}, headers=ADMIN)
    assert r.status_code == 409 and r.json()["error"]["field"] == "nickname"


def test_rate_limits_answer_429_with_retry_after(client: httpx.Client, server: LiveServer) -> None:
    db = str(server.extra["db"])
    args = ["configure", "--db", db, "--round", "1", "--rate", "score:player=3/minute", "--rate", "try:player=2/minute"]
    assert breakit_cli([*args, "--rate", "task:player=1/minute"]) == 0
    assert client.get("/break-it/api/round").json()["rates"]["score"]["player"] == "3/minute"
    dave, erin = invite(client, "dave", "erin")
    for _ in range(3):
        assert client.post("/break-it/api/score", json={"utterance": "hi"}, headers=auth(dave)).status_code == 200
    r = client.post("/break-it/api/score", json={"utterance": "hi"}, headers=auth(dave))
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(r.headers["Retry-After"]) <= 60 and "this player" in r.json()["error"]["message"]
    assert client.post("/break-it/api/score", json={"utterance": "hi"}, headers=auth(erin)).status_code == 200
    task = client.post("/break-it/api/tasks", json={"mode": "safe", "with_context": False}, headers=auth(erin)).json()
    url = f"/break-it/api/tasks/{task['task_id']}/attacks"
    assert [client.post(url, json={"text": f"t{i}"}, headers=auth(erin)).status_code for i in range(3)] == [
        200,
        200,
        429,
    ]
    assert len(client.get(f"/break-it/api/tasks/{task['task_id']}", headers=auth(erin)).json()["attacks"]) == 2
    r = client.post("/break-it/api/tasks", json={"mode": "safe", "with_context": False}, headers=auth(erin))
    assert r.status_code == 429 and "Retry-After" in r.headers  # one task a minute for this round

    # per client address: sign-up is the one action without a token
    args = ["configure", "--db", db, "--round", "1", "--signup", "open", "--rate", "register:address=2/minute"]
    assert breakit_cli(args) == 0
    codes = [client.post("/break-it/api/players", json={"nickname": f"sock{i}"}).status_code for i in range(3)]
    assert codes == [200, 200, 429]
    assert breakit_cli(["configure", "--db", db, "--round", "1", "--signup", "closed", "--default-rates"]) == 0


def test_the_page_is_served(client: httpx.Client) -> None:
    r = client.get("/break-it")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="submit-attack"' in r.text and "/break-it/api" in r.text


def test_break_it_is_off_unless_configured() -> None:
    with live_server(ServiceSettings(host="127.0.0.1", port=0), FakeClassifier()) as live, live.client() as c:
        assert c.get("/break-it").status_code == 404
        assert c.get("/break-it/api/round").status_code == 404


def test_attacks_and_tokens_survive_a_restart(server: LiveServer, client: httpx.Client, tmp_path: Path) -> None:
    """A second service on the same database file sees everything the first one stored."""
    [frank] = invite(client, "frank")
    settings = ServiceSettings(host="127.0.0.1", port=0, breakit_db=str(server.extra["db"]))
    with live_server(settings, FakeClassifier()) as second, second.client() as c:
        assert c.get("/break-it/api/players/me", headers=auth(frank)).json()["nickname"] == "frank"
        board = {p["player"]: p for p in c.get("/break-it/api/scoreboard", headers=auth(frank)).json()["players"]}
        assert board["alice"]["tries"] == ATTACKS_PER_TASK + 1 and board["alice"]["validated"] == 1


def test_the_same_limit_for_player_and_address_counts_each_apart() -> None:
    """One rate text for both scopes: each scope keeps its own window (two players behind one address)."""
    from dialogue_safety.breakit.rates import RateLimits
    from dialogue_safety.core.errors import RateLimited

    rates = RateLimits()
    same = {"validate": {"player": "2/minute", "address": "3/minute"}}
    for player in ("p1", "p1", "p2"):
        rates.hit(1, same, "validate", player=player, address="10.0.0.1")
    with pytest.raises(RateLimited, match="this address"):
        rates.hit(1, same, "validate", player="p3", address="10.0.0.1")
    with pytest.raises(RateLimited, match="this player"):
        rates.hit(1, same, "validate", player="p1", address="10.0.0.2")
    equal = {"validate": {"player": "1/minute", "address": "1/minute"}}
    rates.hit(2, equal, "validate", player="p1", address="10.0.0.9")
    with pytest.raises(RateLimited, match="this player"):
        rates.hit(2, equal, "validate", player="p1", address="10.0.0.8")
    rates.hit(2, equal, "validate", player="p2", address="10.0.0.8")  # the other address's window is its own


def test_ids_and_round_numbers_out_of_range_get_422_not_500(client: httpx.Client) -> None:
    """Integers no database column holds (10**23, 2**63, just past MAX_ID) are refused before any query:
    they used to reach SQLite and answer 500 with a traceback in the log."""
    from dialogue_safety.breakit.game import MAX_ID

    [dave] = invite(client, "oscar")
    huge = [10**23, 2**63, MAX_ID + 1, 0, -1]
    for n in huge:
        calls = [
            ("GET", f"/break-it/api/round?round={n}", None, {}),
            ("GET", f"/break-it/api/tasks/{n}", None, auth(dave)),
            ("POST", f"/break-it/api/tasks/{n}/attacks", {"text": "hello"}, auth(dave)),
            ("POST", f"/break-it/api/attacks/{n}/validations", {"verdict": "confirm"}, auth(dave)),
            ("GET", f"/break-it/api/validations/todo?round={n}", None, auth(dave)),
            ("GET", f"/break-it/api/scoreboard?round={n}", None, auth(dave)),
            ("POST", f"/break-it/api/score?round={n}", {"utterance": "hello"}, auth(dave)),
            ("POST", "/break-it/api/tasks", {"mode": "safe", "round": n}, auth(dave)),
            ("POST", "/break-it/api/players", {"nickname": "eve", "round": n}, {}),
            ("POST", f"/break-it/api/admin/rounds/{n}/close", None, ADMIN),
            ("POST", "/break-it/api/admin/rounds", {"number": n}, ADMIN),
        ]
        for method, path, body, headers in calls:
            r = client.request(method, path, json=body, headers=headers)
            assert r.status_code == 422, (method, path, r.status_code, r.text)
            assert r.json()["error"]["code"] == "invalid_request" and r.json()["error"]["field"] in {
                "round",
                "task_id",
                "attack_id",
                "number",
            }, r.text
    assert client.get(f"/break-it/api/tasks/{MAX_ID}", headers=auth(dave)).status_code == 404  # in range: not found
    assert client.get("/break-it/api/round?round=abc").status_code == 422


@pytest.mark.parametrize("trusted", [True, False])
def test_proxy_headers_count_only_from_the_configured_proxies(tmp_path: Path, trusted: bool) -> None:
    """SAFETY_FORWARDED_ALLOW_IPS: from a trusted proxy, X-Forwarded-For is the client address of the
    per-address rate limits (two players behind the proxy: two buckets); unset, the header is ignored
    (one bucket: the connection's address), so a direct client cannot pick its address."""
    settings = ServiceSettings(
        host="127.0.0.1",
        port=0,
        breakit_db=str(tmp_path / "game.sqlite3"),
        api_key=KEY,
        forwarded_allow_ips="127.0.0.1" if trusted else None,
    )
    with live_server(settings, FakeClassifier()) as live, live.client() as c:
        rates = {"register": {"address": "1/minute"}}
        body = {"number": 1, "signup_open": True, "rates": rates}
        assert c.post("/break-it/api/admin/rounds", json=body, headers=ADMIN).status_code == 200
        codes = [
            c.post(
                "/break-it/api/players", json={"nickname": f"p{i}"}, headers={"X-Forwarded-For": address}
            ).status_code
            for i, address in enumerate(["203.0.113.1", "203.0.113.2", "203.0.113.1"])
        ]
    assert codes == ([200, 200, 429] if trusted else [200, 429, 429])


def test_a_closed_round_takes_no_more_play_and_every_stored_text_is_checked(tmp_path: Path) -> None:
    """A round that is closed refuses live scores, tries and judgements with 409 before anything is counted or
    scored (a player cannot pick a closed round for a fresh rate budget); a flag needs a reason (422); a NUL
    character in any text of a body is refused 422 (PostgreSQL cannot store it); an invitation of several
    nicknames is all or nothing (one refused: nobody invited, no token lost)."""
    settings = ServiceSettings(host="127.0.0.1", port=0, breakit_db=str(tmp_path / "game.sqlite3"), api_key=KEY)
    with live_server(settings, FakeClassifier()) as live, live.client() as c:
        for number in (1, 2):
            body = {"number": number, "rates": GENEROUS}
            assert c.post("/break-it/api/admin/rounds", json=body, headers=ADMIN).status_code == 200
        r = c.post("/break-it/api/admin/players", json={"nicknames": ["zed", "eve", "Zed"]}, headers=ADMIN)
        assert r.status_code == 409 and r.json()["error"]["field"] == "nickname"
        eve, zed = invite(c, "eve", "zed")  # the refused list invited nobody: both names are free
        r = c.post("/break-it/api/admin/players", json={"nicknames": ["amy", "eve"]}, headers=ADMIN)
        assert r.status_code == 409 and "'eve' is taken" in r.json()["error"]["message"]
        [amy] = invite(c, "amy")

        body = {"mode": "offensive", "round": 1, "with_context": False}
        task = c.post("/break-it/api/tasks", json=body, headers=auth(eve)).json()
        url = f"/break-it/api/tasks/{task['task_id']}/attacks"
        fooled = c.post(url, json={"text": "what a dumb name"}, headers=auth(eve)).json()["attack"]
        assert fooled["fooled"]
        judge = f"/break-it/api/attacks/{fooled['id']}/validations"
        r = c.post(judge, json={"verdict": "confirm", "flagged": True, "flag_reason": "  "}, headers=auth(zed))
        assert r.status_code == 422 and "flag_reason" in r.json()["error"]["message"]
        for path, body in [
            ("/break-it/api/score", {"utterance": "hello\x00there"}),
            (url, {"text": "a\x00b"}),
            (judge, {"verdict": "confirm", "flagged": True, "flag_reason": "bad\x00"}),
        ]:
            r = c.post(path, json=body, headers=auth(zed if path == judge else eve))
            assert r.status_code == 422 and "NUL" in r.json()["error"]["message"], (path, r.text)
        r = c.post("/break-it/api/admin/rounds/1/contexts", json={"contexts": [[{"text": "x\x00"}]]}, headers=ADMIN)
        assert r.status_code == 422

        assert c.post("/break-it/api/admin/rounds/1/close", headers=ADMIN).status_code == 200
        r = c.post("/break-it/api/score?round=1", json={"utterance": "hello"}, headers=auth(eve))
        assert r.status_code == 409 and "round 1 is closed" in r.json()["error"]["message"]
        assert c.post("/break-it/api/score?round=2", json={"utterance": "hello"}, headers=auth(eve)).status_code == 200
        r = c.post(url, json={"text": "one more"}, headers=auth(eve))
        assert r.status_code == 409 and r.json()["error"]["field"] == "task_id"
        r = c.post(judge, json={"verdict": "confirm"}, headers=auth(amy))
        assert r.status_code == 409 and r.json()["error"]["field"] == "attack_id"


def test_a_database_locked_by_another_writer_answers_503_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holds the SQLite file's write lock past the busy timeout: the write is answered 503 (retry)
    with Retry-After, not a 500, and works once the lock is gone."""
    import sqlite3

    from dialogue_safety.breakit import store

    monkeypatch.setattr(store, "SQLITE_BUSY_TIMEOUT_MS", 200)
    db = tmp_path / "game.sqlite3"
    settings = ServiceSettings(host="127.0.0.1", port=0, breakit_db=str(db), api_key=KEY)
    with live_server(settings, FakeClassifier()) as live, live.client() as c:
        assert c.post("/break-it/api/admin/rounds", json={"number": 1}, headers=ADMIN).status_code == 200
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer: the sqlite3 shell, a VACUUM...
        r = c.post("/break-it/api/admin/players", json={"nicknames": ["zoe"]}, headers=ADMIN)
        assert r.status_code == 503 and "busy" in r.json()["error"]["message"] and "retry-after" in r.headers
        other.execute("ROLLBACK")
        other.close()
        invite(c, "zoe")  # nothing was written by the refused request
