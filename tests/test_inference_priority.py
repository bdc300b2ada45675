"""Every inference thread runs at the configured priority (``SAFETY_INFERENCE_NICE``), onnxruntime's own
intra-op threads included: the service creates its sessions in a thread whose priority is lowered first,
and Linux threads inherit their creator's nice value. A real ONNX Runtime session (the tiny exported
model); the thread list and nice values are read from /proc."""

# ruff: noqa: F811  (pytest fixtures imported from service_conftest are parameters here)
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from service_conftest import tiny_model_dir  # noqa: F401  (fixture)

from dialogue_safety.core.schema import Example
from dialogue_safety.service.priority import build_at_lower_priority
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import load_onnx_classifier

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")


def thread_nices() -> dict[int, int]:
    """{thread id: nice value} of this process's threads (/proc/self/task/*/stat, field 19)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                out[int(tid)] = int(f.read().rsplit(")", 1)[1].split()[16])
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
    return out


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.parametrize("nice", [0, 5])
def test_onnxruntime_threads_start_at_the_inference_priority(tiny_model_dir: Path, nice: int) -> None:
    base = own_nice()
    before = thread_nices()
    settings = ServiceSettings(
        model_dir=tiny_model_dir, variant="fp32", intra_op_threads=2, inference_workers=1, inference_nice=nice
    )
    classifier = load_onnx_classifier(settings)
    started = {tid: n for tid, n in thread_nices().items() if tid not in before}
    assert started, "onnxruntime started no thread of its own (its intra-op pool, 2 threads asked)"
    assert set(started.values()) == {min(19, base + nice)}, started
    assert own_nice() == base  # the caller (the event loop's thread, in the service) keeps its priority
    [prediction] = classifier.predict_encoded(classifier.encode([Example(utterance="have a nice day")]))
    assert 0.0 <= prediction.score <= 1.0


def test_an_error_while_building_reaches_the_caller() -> None:
    def fail() -> None:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        build_at_lower_priority(3, fail)
    assert build_at_lower_priority(3, own_nice) == min(19, own_nice() + 3)
