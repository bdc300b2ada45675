"""Inference below the event loop's priority, onnxruntime's own threads included (``SAFETY_INFERENCE_NICE``).

Two kinds of thread run inference: the batcher's inference thread
(:mod:`dialogue_safety.service.batcher`, which lowers its own priority when it starts), and the
intra-op thread pool onnxruntime starts when a session is created, whose threads it makes itself
(the Python API offers no hook to set their priority). On Linux a thread's nice value is its own
and a new thread inherits its creator's, so :func:`build_at_lower_priority` creates the classifier
(its sessions, so their pools) in a short-lived thread that first lowered its own priority: every
thread onnxruntime starts there runs ``nice`` steps below the event loop for its whole life. The
variant derivation the load may start in a child process inherits it too.

Where the priority cannot be lowered (another OS, a sandbox that forbids it) a warning is logged and
inference keeps the server's priority: docs/api.md ("Production settings") says how to give the server's
event loop a core of its own instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from dialogue_safety.service.batcher import lower_thread_priority

T = TypeVar("T")


def build_at_lower_priority(nice: int, build: Callable[[], T]) -> T:
    """``build()`` run in a new thread whose priority is first lowered by ``nice`` steps (0: run here, as
    is), so that the threads it starts (onnxruntime's intra-op pool) inherit that priority; its result,
    or what it raised."""
    if nice <= 0:
        return build()
    box: dict[str, T] = {}
    error: list[BaseException] = []

    def run() -> None:
        lower_thread_priority(nice)
        try:
            box["result"] = build()
        except BaseException as exc:  # handed to the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name="safety-model-load", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return box["result"]
