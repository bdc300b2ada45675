"""Hot swap: the admin endpoint and SIGHUP serve a new model directory; requests in flight finish on
the old model; a bad directory is refused and the old model keeps serving. Real ONNX models
(the tiny checkpoint exported, then re-versioned), a real uvicorn server, a real `serve` process."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_conftest import GUARD_S, FakeClassifier, live_server, tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core.errors import NotReady
from dialogue_safety.core.model_card import CARD_FILE
from dialogue_safety.core.schema import Example
from dialogue_safety.service.batcher import LONE_INLINE_CHARS, MicroBatcher
from dialogue_safety.service.json_body import OFF_LOOP_BYTES
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import ServiceState

KEY = "swap-key"
ADMIN = {"X-API-Key": KEY}


def versioned_copy(model_dir: Path, target: Path, version: str) -> Path:
    shutil.copytree(model_dir, target)
    card = json.loads((target / CARD_FILE).read_text())
    card["version"] = version
    (target / CARD_FILE).write_text(json.dumps(card))
    return target


def test_swap_to_a_new_version_and_refuse_bad_directories(
    tiny_model_dir: Path,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    v2 = versioned_copy(tiny_model_dir, tmp_path / "v2", "0.0.2")
    broken = versioned_copy(tiny_model_dir, tmp_path / "broken", "9.9.9")
    (broken / "model.onnx").write_bytes(b"not an onnx graph")
    (tmp_path / "empty").mkdir()
    refusals = set()
    with live_server(model_dir=tiny_model_dir, api_key=KEY) as live, live.client() as c:
        assert c.post("/admin/model", json={"model_dir": str(v2)}).status_code == 401  # no key
        for bad, why in [
            (tmp_path / "empty", "model_card.json"),
            (broken, "does not load"),
            (tmp_path / "nope", "no model"),
        ]:
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="dialogue_safety.service.hot_swap"):
                r = c.post("/admin/model", json={"model_dir": str(bad)}, headers=ADMIN)
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"] == "model_refused" and r.json()["error"]["field"] == "model_dir"
            refusals.add(r.json()["error"]["message"])
            assert why in caplog.text and str(tmp_path) not in r.text  # the log says why, the answer does not
            assert c.get("/v1/model", headers=ADMIN).json()["version"] == "0.0.1"  # the old model keeps serving
            assert (
                c.post("/v1/classify", json={"utterance": "hi"}, headers=ADMIN).json()["model"] == "tiny-random@0.0.1"
            )
        before = c.post("/v1/classify", json={"utterance": "you idiot"}, headers=ADMIN).json()
        r = c.post("/admin/model", json={"model_dir": str(v2)}, headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json() == {
            "model": "tiny-random@0.0.2",
            "previous": "tiny-random@0.0.1",
            "model_dir": v2.name,  # the name only: no local path in an answer
            "drained": True,
            "released": True,
        }
        assert c.get("/v1/model", headers=ADMIN).json()["version"] == "0.0.2"
        after = c.post("/v1/classify", json={"utterance": "you idiot"}, headers=ADMIN).json()
        assert after["model"] == "tiny-random@0.0.2" and after["score"] == pytest.approx(before["score"], abs=1e-6)
        assert len(refusals) == 1  # one answer whatever exists: a refusal tells nothing about the file system
        metrics = c.get("/metrics").text
        assert 'version="0.0.2"' in metrics and 'version="0.0.1"' not in metrics
        assert 'safety_model_swaps_total{outcome="swapped"} 1.0' in metrics
        assert 'safety_model_swaps_total{outcome="refused"} 3.0' in metrics


def test_hostile_model_dirs_get_422_without_echo_and_log_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A path component of 300 characters, a lone surrogate, a newline (a forged log line), an empty or
    over-long path: 422 naming the field, never 500; the answer does not echo the value."""
    fake = FakeClassifier()
    good = tmp_path / "m"
    good.mkdir()
    (good / CARD_FILE).write_text("{}")
    (good / "model.onnx").write_bytes(b"")
    settings = ServiceSettings(host="127.0.0.1", port=0, model_dir=good, api_key=KEY)
    with live_server(settings, factory=lambda s: fake) as live, live.client(headers=ADMIN) as c:
        for bad in [
            "/tmp/" + "a" * 300,
            "/tmp/\ud800",
            "/tmp/x\nINFO forged line",
            "  ",
            "/" + "d/" * 2100,
            "a\x1b[2J",
        ]:
            # json.dumps escapes the lone surrogate: valid JSON text that decodes to no Unicode text
            body = json.dumps({"model_dir": bad})
            r = c.post("/admin/model", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 422, (bad[:40], r.text)
            error = r.json()["error"]
            assert error["field"] == "model_dir" and error["code"] == "invalid_request", error
            assert bad.strip()[:20] not in error["message"] or not bad.strip(), error
        # a path the checks let through into a loop of symbolic links: refused like any other, not 500
        loop = tmp_path / "loop"
        loop.symlink_to(loop)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="dialogue_safety.service.hot_swap"):
            r = c.post("/admin/model", json={"model_dir": str(loop / "x")})
        assert r.status_code == 422 and r.json()["error"]["code"] == "model_refused", r.text


def test_request_values_are_escaped_in_log_lines() -> None:
    from dialogue_safety.service.log_values import printable

    forged = "/models/x\n2026-01-01 INFO forged\r\x1b[2J\u2028\u202e\ud800"
    logged = printable(forged)
    assert logged == "/models/x\\x0a2026-01-01 INFO forged\\x0d\\x1b[2J\\u2028\\u202e\\ud800"
    assert logged.isprintable() and logged.encode("utf-8")
    assert printable("é ok 😀") == "é ok 😀"  # text is left alone
    assert printable("x" * 1000, max_chars=10) == "xxxxxxxxxx... (1000 characters)"


def test_admin_endpoint_is_off_without_an_api_key(tiny_model_dir: Path) -> None:  # noqa: F811
    with live_server(model_dir=tiny_model_dir) as live, live.client() as c:
        r = c.post("/admin/model", json={"model_dir": str(tiny_model_dir)})
        assert r.status_code == 401 and "SAFETY_API_KEY" in r.json()["error"]["message"]


def test_requests_in_flight_finish_on_the_old_model(tmp_path: Path) -> None:
    """Requests held inside the old model's batch while the swap happens all answer 200 from the
    old model, reported with the old model's id and threshold; requests after the swap get the new
    model, its id and its threshold."""
    dirs = {}
    fakes = {"old": FakeClassifier(threshold=0.5), "new": FakeClassifier(threshold=0.05)}
    fakes["new"].card = fakes["new"].card.model_copy(update={"version": "2.0.0"})
    fakes["new"].model_id = fakes["new"].card.model_id
    for name in fakes:
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        (dirs[name] / CARD_FILE).write_text("{}")
        (dirs[name] / "model.onnx").write_bytes(b"")
    old = fakes["old"]
    settings = ServiceSettings(
        host="127.0.0.1",
        port=0,
        model_dir=dirs["old"],
        api_key=KEY,
        max_batch_size=4,
    )
    with live_server(settings, factory=lambda s: fakes[s.model_dir.name]) as live:
        old.gate.clear()
        answers: list[httpx.Response] = []

        def call(i: int) -> None:
            with httpx.Client(base_url=live.url, headers=ADMIN, timeout=GUARD_S) as c:
                answers.append(c.post("/v1/classify", json={"utterance": f"message {i}"}))

        callers = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in callers:
            t.start()
        assert old.entered.wait(GUARD_S)
        batcher = live.app.state.safety.batcher
        deadline = time.monotonic() + GUARD_S
        while batcher._outstanding < 6:  # every caller is in the old model's batcher (one batch held, the rest queued)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        swap_result: list[httpx.Response] = []
        swapper = threading.Thread(
            target=lambda: swap_result.append(
                httpx.post(
                    f"{live.url}/admin/model", json={"model_dir": str(dirs["new"])}, headers=ADMIN, timeout=GUARD_S
                )
            )
        )
        swapper.start()
        deadline = time.monotonic() + GUARD_S
        with live.client(headers=ADMIN) as c:
            while c.get("/v1/model").json()["version"] != "2.0.0":  # the switch happens while the old batch is held
                assert time.monotonic() < deadline
                time.sleep(0.02)
            fresh = c.post("/v1/classify", json={"utterance": "after the swap"}).json()
        assert (fresh["model"], fresh["threshold"], fresh["label"]) == ("fake@2.0.0", 0.05, "OFFENSIVE")
        assert swapper.is_alive()  # still draining the old model
        old.gate.set()
        for t in [*callers, swapper]:
            t.join(GUARD_S)
        assert [r.status_code for r in answers] == [200] * 6, [r.text for r in answers]
        # scored by the old model, so answered with its id, threshold and label (score 0.1 < 0.5)
        assert {(r.json()["model"], r.json()["threshold"], r.json()["label"]) for r in answers} == {
            ("fake@1.2.3", 0.5, "SAFE")
        }
        assert sum(len(b) for b in old.batches) == 6  # every in-flight request was answered by the old model
        assert swap_result[0].status_code == 200 and swap_result[0].json()["drained"] is True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_sighup_reloads_the_model_directory_in_a_serve_process(tiny_model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    """`dialogue-safety serve --model LINK`; point LINK at a new version; SIGHUP; the version changes."""
    v2 = versioned_copy(tiny_model_dir, tmp_path / "v2", "0.0.2")
    link = tmp_path / "current"
    link.symlink_to(tiny_model_dir)
    port = _free_port()
    env = {**os.environ, "SAFETY_API_KEY": KEY}
    cmd = [
        sys.executable,
        "-m",
        "dialogue_safety.cli.main",
        "serve",
        "--model",
        str(link),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + GUARD_S

        def version() -> str | None:
            try:
                r = httpx.get(f"{url}/v1/model", headers=ADMIN, timeout=5)
            except httpx.TransportError:
                return None
            return str(r.json()["version"]) if r.status_code == 200 else None

        while version() != "0.0.1":
            assert proc.poll() is None and time.monotonic() < deadline, "serve never became ready"
            time.sleep(0.1)
        link.unlink()
        link.symlink_to(v2)
        proc.send_signal(signal.SIGHUP)
        while version() != "0.0.2":
            assert proc.poll() is None, "serve died on SIGHUP"
            assert time.monotonic() < deadline, "SIGHUP did not swap the model"
            time.sleep(0.1)
        assert (
            httpx.post(f"{url}/v1/classify", json={"utterance": "hi"}, headers=ADMIN, timeout=GUARD_S)
            .json()["model"]
            .endswith("0.0.2")
        )
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _process_status(pid: int | str = "self") -> tuple[float, int]:
    """(resident memory in MiB, threads: onnxruntime's native ones included) of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_swap_releases_the_replaced_model_and_its_threads(tiny_model_dir: Path) -> None:  # noqa: F811
    """The replaced classifier (its onnxruntime session and thread pool) is gone when the swap answers."""
    import weakref

    with live_server(model_dir=tiny_model_dir, api_key=KEY) as live, live.client(headers=ADMIN) as c:
        state = live.app.state.safety
        assert c.post("/admin/model", json={}).status_code == 200  # the executor threads a swap uses exist now
        threads = _process_status()[1]
        for _ in range(5):
            replaced = weakref.ref(state.classifier)
            r = c.post("/admin/model", json={})
            assert r.status_code == 200 and r.json()["released"] is True, r.text
            assert replaced() is None  # nothing holds the old model any more: freed, not waiting for a collection
            assert c.post("/v1/classify", json={"utterance": "hi"}).status_code == 200
        # each swap used to leave its session's threads behind (at least one a swap); the test process's
        # other threads (helper pools, servers of earlier tests ending) may come and go by one or two
        assert _process_status()[1] <= threads + 2


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_twenty_swaps_under_traffic_end_within_ten_percent_of_the_starting_memory(
    tiny_model_dir: Path,  # noqa: F811
) -> None:
    """A `serve` process (the CLI's frozen heap and allocator settings) swapped 20 times while a client
    keeps classifying: every request is answered, and memory and threads come back to where they were."""
    port = _free_port()
    env = {**os.environ, "SAFETY_API_KEY": KEY}
    cmd = [sys.executable, "-m", "dialogue_safety.cli.main", "serve", "--model", str(tiny_model_dir)]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "--log-level", "warning"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + GUARD_S
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "serve never became ready"
            try:
                if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        with httpx.Client(base_url=url, headers=ADMIN, timeout=GUARD_S) as c:
            for _ in range(2):  # the first swaps start the thread pools they reuse afterwards
                assert c.post("/admin/model", json={}).json()["released"] is True
            for _ in range(20):
                c.post("/v1/classify", json={"utterance": "warm up the allocator"})
            rss_start, threads_start = _process_status(proc.pid)
            answers: list[int] = []
            stop = threading.Event()

            def traffic() -> None:
                with httpx.Client(base_url=url, headers=ADMIN, timeout=GUARD_S) as t:
                    while not stop.is_set():
                        answers.append(t.post("/v1/classify", json={"utterance": "still there?"}).status_code)

            client = threading.Thread(target=traffic)
            client.start()
            try:
                for _ in range(20):
                    r = c.post("/admin/model", json={})
                    assert r.status_code == 200 and r.json()["drained"] and r.json()["released"], r.text
            finally:
                stop.set()
                client.join(GUARD_S)
            rss_end, threads_end = _process_status(proc.pid)
        assert answers and set(answers) == {200}, answers  # requests in flight during the swaps were answered
        assert rss_end <= 1.1 * rss_start, f"RSS {rss_start:.0f} MiB -> {rss_end:.0f} MiB after 20 swaps"
        assert threads_end <= threads_start + 2, f"threads {threads_start} -> {threads_end} after 20 swaps"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- the seams between a swap and the requests in flight (ServiceState with fake models, no HTTP) --------------
def _held_encode(fake: FakeClassifier, prefix: str) -> tuple[threading.Event, threading.Event]:
    """``fake``'s encoding of an utterance starting with ``prefix`` waits for ``release`` (``entered`` set first)."""
    entered, release = threading.Event(), threading.Event()
    plain = fake.encode

    def encode(examples: Any) -> Any:
        if any(e.utterance.startswith(prefix) for e in examples):
            entered.set()
            assert release.wait(GUARD_S)
        return plain(examples)

    fake.encode = encode  # type: ignore[method-assign]
    return entered, release


def test_an_explanation_planned_on_the_old_model_during_a_swap_finishes_there() -> None:
    """The explanation's plan is being encoded on the old model when the swap switches and starts draining it: the
    explanation is in flight there, so it is queued and answered by the old model, and the drain waits for it."""
    old, new = FakeClassifier(), FakeClassifier()
    entered, release = _held_encode(old, "hold")

    async def main() -> None:
        state = ServiceState(ServiceSettings(), factory=lambda s: old)
        await state.load()
        # longer than a lone request encoded on the loop: the plan is encoded in the encoding thread
        example = Example.from_texts("hold on " + "you are an idiot " * (LONE_INLINE_CHARS // 16), ["hi there"])
        explained = asyncio.create_task(state.score([example], client="c", explain="occlusion"))
        await asyncio.to_thread(entered.wait, GUARD_S)
        previous = await state.install(new, state.settings)  # the swap's switch
        assert previous is not None
        draining = asyncio.create_task(state.retire(previous, GUARD_S))
        await asyncio.sleep(0.01)
        assert not draining.done()
        release.set()
        scored = await asyncio.wait_for(explained, GUARD_S)
        assert scored is not None and scored.served.batcher is previous and scored.explanation is not None
        assert await asyncio.wait_for(draining, GUARD_S) is True
        await state.stop()

    asyncio.run(main())


def test_a_large_request_sized_during_a_swap_finishes_on_the_old_model() -> None:
    """A large request's cost bound runs off the loop when the swap switches: it counts as in flight from its first
    check, so the drain waits for it and the old model answers it (not 503 shutting down)."""
    old, new = FakeClassifier(), FakeClassifier()

    async def main() -> None:
        state = ServiceState(ServiceSettings(), factory=lambda s: old)
        await state.load()
        batcher = state.batcher
        assert batcher is not None and batcher._bound is not None
        entered, release = threading.Event(), threading.Event()
        bound = batcher._bound

        def held_bound(examples: Any, enough: int) -> int:
            entered.set()
            assert release.wait(GUARD_S)
            return bound(examples, enough)

        batcher._bound = held_bound
        large = Example(utterance="word " * (OFF_LOOP_BYTES // 5 + 10))  # its bound runs in a thread
        scoring = asyncio.create_task(state.score([large], client="c"))
        await asyncio.to_thread(entered.wait, GUARD_S)
        previous = await state.install(new, state.settings)
        assert previous is batcher
        draining = asyncio.create_task(state.retire(previous, GUARD_S))
        await asyncio.sleep(0.01)
        assert not draining.done()  # it waits for the request still entering
        release.set()
        scored = await asyncio.wait_for(scoring, GUARD_S)
        assert scored is not None and scored.served.batcher is previous and len(scored.outcomes) == 1
        assert await asyncio.wait_for(draining, GUARD_S) is True
        await state.stop()

    asyncio.run(main())


async def _swapped_while_holding_a_request(
    old: FakeClassifier, new: FakeClassifier
) -> tuple[ServiceState, asyncio.Task[Any], MicroBatcher, asyncio.Task[bool]]:
    """A service on ``old`` (its gate cleared: a request held in its batch), swapped to ``new``: the state, the held
    request, the old batcher and its drain (``ServiceState.retire``), running."""
    old.gate.clear()
    state = ServiceState(ServiceSettings(), factory=lambda s: old)
    await state.load()
    held = asyncio.create_task(state.score([Example(utterance="still running")], client="a"))
    await asyncio.to_thread(old.entered.wait, GUARD_S)
    previous = await state.install(new, state.settings)
    assert previous is not None
    return state, held, previous, asyncio.create_task(state.retire(previous, GUARD_S))


def test_the_queue_depth_gauge_is_the_serving_models_while_the_old_one_drains() -> None:
    """The old model's batcher, draining after a swap, leaves the depth gauge to the new one: its stop does not
    set it to 0 while the new model has an item waiting."""
    old, new = FakeClassifier(), FakeClassifier()

    async def main() -> None:
        state, held, previous, draining = await _swapped_while_holding_a_request(old, new)
        new.gate.clear()
        running = asyncio.create_task(state.score([Example(utterance="first")], client="b"))
        await asyncio.to_thread(new.entered.wait, GUARD_S)
        waiting = asyncio.create_task(state.score([Example(utterance="second")], client="c"))
        await asyncio.sleep(0.01)
        assert state.metrics.queue_depth._value.get() == 1  # the new batcher's waiting item
        old.gate.set()
        assert await asyncio.wait_for(draining, GUARD_S) is True  # the old batcher finished and stopped
        assert (await asyncio.wait_for(held, GUARD_S)).served.batcher is previous
        assert state.metrics.queue_depth._value.get() == 1  # still the new batcher's
        new.gate.set()
        await asyncio.wait_for(asyncio.gather(running, waiting), GUARD_S)
        await state.stop()

    asyncio.run(main())


def test_stopping_the_service_stops_a_batcher_still_draining() -> None:
    """A request held on the old model keeps its drain going; stopping the service stops that batcher too: the
    request fails shutting down and the drain reports it did not finish."""
    old, new = FakeClassifier(), FakeClassifier()

    async def main() -> None:
        state, held, previous, draining = await _swapped_while_holding_a_request(old, new)
        await asyncio.sleep(0.01)
        await state.stop()
        assert await asyncio.wait_for(draining, GUARD_S) is False
        with pytest.raises(NotReady) as refused:
            await asyncio.wait_for(held, GUARD_S)
        assert refused.value.code == "shutting_down" and not previous.running
        old.gate.set()

    asyncio.run(main())
