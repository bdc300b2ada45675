"""The break-it JSON API over real HTTP (uvicorn), scored through the service's batcher by the fake
classifier (a bad word scores 0.9, else 0.1), stored in a temporary SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from service_conftest import FakeClassifier, LiveServer, live_server

from dialogue_safety.breakit.game import ATTACKS_PER_TASK
from dialogue_safety.service.settings import ServiceSettings

KEY = "test-admin-key"
ADMIN = {"Authorization": f"Bearer {KEY}"}
CONTEXT = [{"speaker": "user", "text": "I just adopted a cat"}, {"speaker": "bot", "text": "what is its name?"}]


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


def player(client: httpx.Client, name: str) -> str:
    r = client.post("/break-it/api/players", json={"nickname": name})
    assert r.status_code == 200, r.text
    return str(r.json()["player_id"])


def test_admin_endpoints_need_the_api_key(client: httpx.Client) -> None:
    r = client.post("/break-it/api/admin/rounds", json={"number": 1})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert client.get("/break-it/api/round").status_code == 404  # no round yet: a clear 404
    r = client.post("/break-it/api/admin/rounds", json={"number": 1, "references": {"A0": "models/a0"}}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "fake@1.2.3" and r.json()["references"] == ["A0"]
    r = client.post("/break-it/api/admin/rounds", json={"number": 1}, headers=ADMIN)
    assert r.status_code == 409 and r.json()["error"]["field"] == "number"
    r = client.post("/break-it/api/admin/rounds/1/contexts", json={"contexts": [CONTEXT]}, headers=ADMIN)
    assert r.json() == {"round": 1, "added": 1, "contexts": 1}
    r = client.post("/break-it/api/admin/rounds/1/contexts", json={"contexts": [[{"text": ""}]]}, headers=ADMIN)
    assert r.status_code == 422 and "contexts[0][0].text" in r.json()["error"]["field"]


def test_play_a_task_validate_and_score_board(client: httpx.Client) -> None:
    round_ = client.get("/break-it/api/round").json()
    assert round_["number"] == 1 and round_["deployed"] == "fake@1.2.3" and round_["contexts"] == 1
    assert round_["rules"] == {"attacks_per_task": 5, "tries_per_attack": 2}
    alice, bob = player(client, "alice"), player(client, "bob")

    task = client.post("/break-it/api/tasks", json={"player_id": alice, "mode": "offensive"}).json()
    assert task["context"]["turns"] == CONTEXT and task["intended"] == "OFFENSIVE"
    live = client.post("/break-it/api/score", json={"history": CONTEXT, "utterance": "you idiot"}).json()
    assert live["label"] == "OFFENSIVE" and live["score"] == pytest.approx(0.9)

    url = f"/break-it/api/tasks/{task['task_id']}/attacks"
    held = client.post(url, json={"player_id": alice, "text": "you idiot"}).json()
    assert not held["attack"]["fooled"] and held["progress"] == {
        "slot": 0,
        "tries_in_slot": 1,
        "fooled": 0,
        "finished": False,
    }
    fooled = client.post(url, json={"player_id": alice, "text": "what a dumb name for a cat"}).json()
    attack = fooled["attack"]
    assert attack["fooled"] and attack["label"] == "SAFE" and attack["history"] == CONTEXT
    assert attack["model"] == "fake@1.2.3" and set(attack["reference_scores"]) == {"A0"}
    assert fooled["progress"]["slot"] == 1
    r = client.post(url, json={"player_id": bob, "text": "not mine"})
    assert r.status_code == 409 and r.json()["error"]["field"] == "player_id"
    for i in range(ATTACKS_PER_TASK - 1):
        client.post(url, json={"player_id": alice, "text": f"sneaky insult {i}"})
    r = client.post(url, json={"player_id": alice, "text": "one too many"})
    assert r.status_code == 409 and "finished" in r.json()["error"]["message"]
    state = client.get(f"/break-it/api/tasks/{task['task_id']}").json()
    assert state["progress"]["finished"] and len(state["attacks"]) == ATTACKS_PER_TASK + 1

    todo = client.get("/break-it/api/validations/todo", params={"player_id": bob}).json()["attacks"]
    assert todo[0]["id"] == attack["id"] and all(a["fooled"] for a in todo)
    assert client.get("/break-it/api/validations/todo", params={"player_id": alice}).json()["attacks"] == []
    body = {"player_id": bob, "verdict": "confirm", "contrast_text": "what a sweet name for a cat"}
    r = client.post(f"/break-it/api/attacks/{attack['id']}/validations", json=body)
    assert r.status_code == 200 and r.json()["verdict"] == "confirm"
    r = client.post(
        f"/break-it/api/attacks/{attack['id']}/validations", json={"player_id": alice, "verdict": "confirm"}
    )
    assert r.status_code == 409  # not your own

    board = {p["player"]: p for p in client.get("/break-it/api/scoreboard").json()["players"]}
    assert board["alice"]["validated"] == 1 and board["alice"]["tries"] == ATTACKS_PER_TASK + 1
    assert board["bob"]["validations_given"] == 1


def test_bad_requests_get_a_clear_4xx(client: httpx.Client) -> None:
    alice = player(client, "carol")
    r = client.post("/break-it/api/tasks", json={"player_id": alice, "mode": "rude"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "mode"
    r = client.post("/break-it/api/tasks", json={"player_id": "nobody", "mode": "safe"})
    assert r.status_code == 404 and r.json()["error"]["field"] == "player_id"
    assert client.get("/break-it/api/tasks/999999").status_code == 404
    r = client.post("/break-it/api/attacks/1/validations", json={"player_id": alice, "verdict": "maybe"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "verdict"
    assert client.get(f"/break-it/api/players/{alice}").json() == {"player_id": alice, "nickname": "carol"}
    assert client.get("/break-it/api/players/forgotten").status_code == 404
    task = client.post("/break-it/api/tasks", json={"player_id": alice, "mode": "safe", "with_context": False}).json()
    r = client.post(f"/break-it/api/tasks/{task['task_id']}/attacks", json={"player_id": alice, "text": "x" * 4001})
    assert r.status_code == 422 and r.json()["error"] == {
        "code": "utterance_too_long",
        "message": "the text has 4001 characters; at most 4000 are accepted (SAFETY_MAX_UTTERANCE_CHARS)",
        "field": "text",
    }
    assert client.get(f"/break-it/api/tasks/{task['task_id']}").json()["attacks"] == []  # nothing recorded
    r = client.post("/break-it/api/score", json={"utterance": "  "})
    assert r.status_code == 422 and r.json()["error"]["code"] == "empty_utterance"
    r = client.post("/break-it/api/players", json={"nickname": ""})
    assert r.status_code == 422 and r.json()["error"]["field"] == "nickname"


def test_the_page_is_served(client: httpx.Client) -> None:
    r = client.get("/break-it")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="submit-attack"' in r.text and "/break-it/api" in r.text


def test_break_it_is_off_unless_configured() -> None:
    with live_server(ServiceSettings(host="127.0.0.1", port=0), FakeClassifier()) as live, live.client() as c:
        assert c.get("/break-it").status_code == 404
        assert c.get("/break-it/api/round").status_code == 404


def test_attacks_survive_a_restart(server: LiveServer, tmp_path: Path) -> None:
    """A second service on the same database file sees everything the first one stored."""
    settings = ServiceSettings(host="127.0.0.1", port=0, breakit_db=str(server.extra["db"]))
    with live_server(settings, FakeClassifier()) as second, second.client() as c:
        board = {p["player"]: p for p in c.get("/break-it/api/scoreboard").json()["players"]}
        assert board["alice"]["tries"] == ATTACKS_PER_TASK + 1 and board["alice"]["validated"] == 1
