"""Memory tuning of the serving process: the garbage collector and glibc's allocator.

:func:`settle_heap` keeps what is loaded at start out of the garbage collector's way (the CLI calls
it once the model serves); :func:`fix_trim_threshold` and :func:`give_back_freed_memory` give the
memory freed after a burst of requests back to the system. All three are called by
``dialogue-safety serve`` (:mod:`dialogue_safety.service.cli`); the app itself works without them.
:func:`collect_replaced` is the hot swap's (:mod:`dialogue_safety.service.hot_swap`): the model it
replaced is freed at once, frozen heap or not.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import sys
from collections.abc import Callable
from typing import Protocol

GC_FULL_EVERY = 1000  # younger collections between two full ones (CPython's default: 10)
M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter number
TRIM_THRESHOLD_BYTES = 128 * 1024  # glibc's own default, made fixed
TRIM_EVERY_S = 1.0  # how often freed memory goes back to the system, after connection activity


class Activity(Protocol):
    """What :func:`give_back_freed_memory` watches (the server's ``ConnectionGuard``)."""

    activity: int  # grows with connections opened or closed and request heads received
    trimmer: asyncio.Task[None] | None


def settle_heap() -> None:
    """Keep the long-lived heap out of the garbage collector's scans, once the model serves.

    The app, the model and the tokenizer hold about a million Python objects that live as long as
    the process. Under load, requests in flight survive the young collections, so the oldest
    generation keeps growing and CPython runs a full collection about every second; each one
    scans the whole heap with the event loop stopped: every answer due then, 429s included, waits.
    So: collect once, freeze what is left (still freed by reference counting, never scanned again),
    and run full collections 100 times less often (what they find under load is a few hundred objects
    of reference cycles; the requests waiting their turn are the rest of the heap, and 10 times was
    not enough: lab/notes/abuse.md)."""
    gc.collect()
    gc.freeze()
    young, middle, oldest = gc.get_threshold()
    gc.set_threshold(young, middle, max(oldest, GC_FULL_EVERY))


def collect_replaced() -> None:
    """A full collection, of the heap :func:`settle_heap` froze too, then the heap frozen again (when it
    was) and the freed memory given back to the system (glibc).

    A replaced model (its onnxruntime session with its threads and arenas, its tokenizer, its
    batcher) is held in reference cycles (the batcher and its helpers point at each other), so
    reference counting alone never frees it, and the full collections that would are rare here
    (:data:`GC_FULL_EVERY`); the first model was even frozen out of them. Without this, every hot
    swap kept the model it replaced. One full scan of the heap per swap, on the event loop: swaps
    are rare, and the scan is far shorter than loading the model that caused it."""
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def fix_trim_threshold() -> bool:
    """Let glibc give freed memory back to the system after a burst (Linux with glibc; True if set).

    glibc raises its mmap and trim thresholds each time a large mmapped block is freed (a 2 MB
    request body is one), so the buffers of a later burst (a thousand slow or partial bodies) come
    from the heap and stay mapped after they are freed: RSS stayed ~70 MiB above its baseline after
    the hostile-client benchmark's slow-body attack. Fixing the trim threshold at glibc's default turns that
    adjustment off (as ``MALLOC_TRIM_THRESHOLD_`` would; a value set there is left alone).
    Call before the first large allocation."""
    mallopt = _glibc("mallopt")
    if mallopt is None or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def _glibc(name: str) -> Callable[..., int] | None:
    """A glibc allocator function (None elsewhere: not Linux, or musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    return function


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None elsewhere)."""
    return _glibc("malloc_trim")


def give_back_freed_memory(guard: Activity, every_s: float = TRIM_EVERY_S) -> asyncio.Task[None] | None:
    """Every ``every_s``, if connections came, went or sent requests since the last time, give the
    memory freed since back to the system (glibc's ``malloc_trim``; None where there is none, and
    no task). The fixed trim threshold (:func:`fix_trim_threshold`) returns the top of the heap;
    this also returns free pages inside it. A trim is short when there is nothing to return, so
    once a second after activity costs the loop little.
    The task is kept on ``guard`` (``guard.trimmer``)."""
    trim = _malloc_trim()
    if trim is None:
        return None

    async def watch() -> None:
        trimmed = guard.activity
        while True:
            await asyncio.sleep(every_s)
            if guard.activity != trimmed:
                trimmed = guard.activity
                trim(0)

    guard.trimmer = asyncio.get_running_loop().create_task(watch(), name="safety-give-back-freed-memory")
    return guard.trimmer
