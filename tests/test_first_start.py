"""The first start of a model that needs a derived variant: a log line says so, and /ready's 503 names
what the service is doing meanwhile (deriving took tens of seconds in silence), never where."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

import pytest
from service_conftest import GUARD_S, FakeClassifier, live_server, tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core import variants
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import BUILDING_VARIANT


def test_the_first_start_says_it_derives_the_variant(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)  # exported with fp32 only: 'optimized' must be derived
    assert not variants.is_derived(model, "optimized") and variants.is_derived(model, "fp32")
    caplog.set_level(logging.WARNING)  # a service that logs warnings only still says it...
    caplog.handler.setLevel(logging.INFO)  # (...and the test sees it)
    with live_server(model_dir=model, variant="optimized") as live, live.client() as c:
        assert c.get("/v1/model").json()["serving"]["variant"] == "optimized"
    said = [r.getMessage() for r in caplog.records if r.name == "dialogue_safety.core.variants"]
    assert said == [
        f"building the optimized variant of {model} (first start with this model, recipe or onnxruntime version; "
        "later starts reuse it)"
    ]
    assert variants.is_derived(model, "optimized")
    caplog.clear()
    with live_server(model_dir=model, variant="optimized"):  # the second start: nothing to derive, nothing said
        pass
    assert not [r for r in caplog.records if r.name == "dialogue_safety.core.variants"]


def test_ready_names_what_the_first_load_is_doing() -> None:
    deriving = threading.Event()
    release = threading.Event()

    def slow_factory(settings: ServiceSettings) -> FakeClassifier:
        logging.getLogger("dialogue_safety.core.variants").info("deriving the int8 variant of /models/x (...)")
        deriving.set()
        assert release.wait(GUARD_S)
        return FakeClassifier()

    with live_server(factory=slow_factory, wait_ready=False) as live, live.client() as c:
        assert deriving.wait(GUARD_S)
        r = c.get("/ready")
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.json()["error"] == {  # what is happening, not where: the path stays in the log
            "code": "not_ready",
            "message": f"the model is not ready yet ({BUILDING_VARIANT}); retry later",
            "field": None,
        }
        assert "/models/x" not in c.post("/v1/classify", json={"utterance": "hi"}).text
        release.set()
        deadline = time.monotonic() + GUARD_S
        while c.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)


def test_a_later_start_starts_no_child_process_and_a_new_onnxruntime_derives_again(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import concurrent.futures

    from dialogue_safety.core.variants.stamps import read_stamp, save_atomic, set_meta

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    first = variants.ensure_variant_in_subprocess(model, "optimized")  # the first start derives it (in a child)

    def no_child(*_: object, **__: object) -> None:
        raise AssertionError("a child process was started although nothing had to be derived")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_child)
    assert variants.ensure_variant_in_subprocess(model, "optimized") == first
    # the same file stamped by another onnxruntime is stale: derived again, with this one's stamp
    import onnx

    graph = onnx.load(str(first))
    set_meta(graph, {"onnxruntime": "0.0.1"})
    save_atomic(graph, first)
    assert variants.derived_path(model, "optimized") is None
    monkeypatch.undo()
    again = variants.ensure_variant_in_subprocess(model, "optimized")
    assert again == first and read_stamp(again)["onnxruntime"] != "0.0.1"


def test_ready_says_warming_up_while_the_model_warms_up() -> None:
    fake = FakeClassifier()
    fake.warm_gate.clear()
    with live_server(classifier=fake, wait_ready=False) as live, live.client() as c:
        deadline = time.monotonic() + GUARD_S
        while "warming up" not in c.get("/ready").text:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert c.get("/ready").status_code == 503
        fake.warm_gate.set()
        while c.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
