"""No answer of the service names a path of the machine it runs on: not the 503s while the first start
builds a variant or after a failed load, not ``GET /v1/model`` with ``--policy /abs/path``, not an error
(bad requests, refused policies, refused or accepted hot swaps). The paths stay in the server's log.

A local path here is a slash-separated run of at least two parts whose first part exists at this machine's
root (``/tmp/...``, ``/home/...``): an endpoint such as ``/v1/classify`` is not one.
"""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from service_conftest import GUARD_S, FakeClassifier, LiveServer, live_server, tiny_model_dir  # noqa: F401

from dialogue_safety.service.settings import ServiceSettings

KEY = "s3cret-key"
ADMIN = {"X-API-Key": KEY}
PATHLIKE = re.compile(r"(?<![\w.~-])/[\w.@+-]+(?:/[\w.@+-]+)+")
CLASSIFY_BODY = {"utterance": "hello"}


def local_paths(text: str) -> list[str]:
    """The paths of this machine that ``text`` names."""
    return [p for p in PATHLIKE.findall(text) if Path("/" + p.split("/")[1]).exists()]


def assert_no_local_path(response: httpx.Response, *secrets: Path) -> None:
    text = response.text
    where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
    assert not local_paths(text), f"{where} names a local path: {local_paths(text)}\n{text[:500]}"
    for secret in secrets:
        assert str(secret) not in text, f"{where} names {secret}"


def test_the_detector_finds_local_paths_and_not_endpoints(tmp_path: Path) -> None:
    assert local_paths(f"loading the model from {tmp_path}/model; retry") == [f"{tmp_path}/model"]
    assert local_paths("POST /v1/classify/batch or /v1/moderations, see /health") == []
    assert local_paths("policy.toml:3: block[0] is not valid") == []


def every_answer(live: LiveServer, headers: dict[str, str] | None = None) -> list[httpx.Response]:
    """A request to each kind of endpoint, the way a client would send it."""
    with live.client(headers=headers or {}) as c:
        return [
            c.get("/ready"),
            c.get("/health"),
            c.get("/v1/model"),
            c.post("/v1/classify", json=CLASSIFY_BODY),
            c.post("/v1/classify/batch", json={"items": ["hello", "you idiot"]}),
            c.post("/v1/moderations", json={"input": "hello"}),
        ]


def test_the_503_while_the_first_start_builds_a_variant_says_what_not_where(tmp_path: Path) -> None:
    model = tmp_path / "models" / "default"
    building, release = threading.Event(), threading.Event()

    def slow_factory(settings: ServiceSettings) -> FakeClassifier:
        # what dialogue_safety.core.variants logs on a first start (with the model directory's path)
        logging.getLogger("dialogue_safety.core.variants").info("building the int8 variant of %s (first start)", model)
        building.set()
        assert release.wait(GUARD_S)
        return FakeClassifier()

    with live_server(factory=slow_factory, wait_ready=False, model_dir=tmp_path) as live:
        try:
            assert building.wait(GUARD_S)
            answers = every_answer(live)
            assert any(r.status_code == 503 and "building" in r.text for r in answers), [r.text for r in answers]
            for r in answers:
                assert_no_local_path(r, tmp_path)
        finally:
            release.set()
        live.wait_ready()


def test_the_503_after_a_failed_load_names_no_path(tmp_path: Path) -> None:
    def broken(settings: ServiceSettings) -> FakeClassifier:
        raise FileNotFoundError(f"no such file: {tmp_path}/model/model.onnx")

    with live_server(factory=broken, wait_ready=False, model_dir=tmp_path) as live:
        deadline = time.monotonic() + GUARD_S
        while live.app.state.safety.load_error is None:
            assert time.monotonic() < deadline, "the load never failed"
            time.sleep(0.02)
        answers = every_answer(live)
    assert any(r.status_code == 503 and r.json()["error"]["code"] == "model_failed" for r in answers)
    for r in answers:
        assert_no_local_path(r, tmp_path)


@pytest.mark.slow
def test_model_policy_errors_and_hot_swaps_name_files_not_paths(tiny_model_dir: Path, tmp_path: Path) -> None:
    policy = tmp_path / "operator" / "policy.toml"
    policy.parent.mkdir()
    policy.write_text('[[block]]\nname = "no-fruit"\nterms = ["banana"]\n', encoding="utf-8")
    bad_policy = tmp_path / "operator" / "bad.toml"
    bad_policy.write_text('[[block]]\nname = "x"\nregexes = ["("]\n', encoding="utf-8")
    # the policy directory (SAFETY_POLICY_DIR) holds the files /admin/policy may load: its path is never shown
    with live_server(model_dir=tiny_model_dir, policy=policy, policy_dir=policy.parent, api_key=KEY) as live:
        answers = every_answer(live, ADMIN)
        assert [r.status_code for r in answers] == [200] * len(answers), [r.text for r in answers]
        assert answers[2].json()["serving"]["policy"]["source"] == "policy.toml"
        with live.client(headers=ADMIN) as c:
            answers += [
                c.post("/v1/classify", content=b"{not json"),
                c.post("/v1/classify", json={"utterance": ""}),
                c.post("/v1/classify", json={"utterance": "hi", "nope": 1}),
                c.get("/v1/nowhere"),
                c.delete("/v1/classify"),
                c.post("/v1/classify", json=CLASSIFY_BODY, headers={"X-API-Key": "wrong"}),
                c.get("/metrics"),
                c.post("/admin/policy", json={"path": str(bad_policy)}),
                c.post("/admin/policy", json={"path": str(tmp_path / "missing.toml")}),
                c.post("/admin/policy", json={}),
                c.post("/admin/model", json={"model_dir": str(tmp_path / "no-model-here")}),
                c.post("/admin/model", json={}),  # the served directory, read again
            ]
    assert answers[-5].status_code == 422 and "bad.toml:3" in answers[-5].text
    assert answers[-3].status_code == 200 and answers[-3].json()["previous"] == "policy.toml"
    assert answers[-1].status_code == 200 and answers[-1].json()["model_dir"] == tiny_model_dir.name
    for r in answers:
        assert_no_local_path(r, tmp_path, tiny_model_dir)
