"""Freed request buffers go back to the system (service.server.fix_trim_threshold), checked in a
fresh interpreter: glibc's dynamic thresholds would keep a burst of 1 MB buffers mapped after an
8 MB block was freed (what a large request body does), and the fix turns that off."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = """
import gc, sys
from service.server import fix_trim_threshold
def rss_mib():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
applied = fix_trim_threshold() if sys.argv[1] == "fix" else False
big = bytearray(8 * 2**20); del big
before = rss_mib()
blocks = [bytearray(1_000_000) for _ in range(150)]
del blocks; gc.collect()
print(applied, rss_mib() - before)
"""


def _retained_mib(mode: str) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    applied, retained = out.stdout.split()
    return applied == "True", float(retained)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator behaviour (Linux)")
def test_a_burst_of_buffers_is_given_back_after_the_fix() -> None:
    applied, retained = _retained_mib("fix")
    assert applied
    assert retained < 30, f"{retained:.0f} MiB still mapped after the burst was freed"
    # the behaviour the fix is for: without it glibc keeps the burst mapped. Whether it does in one
    # process depends on the randomised address layout (about 3 processes in 4 here), so: in any of 8
    assert any(_retained_mib("none")[1] > 100 for _ in range(8))


def test_freed_memory_goes_back_after_activity_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from service import server

    trims: list[int] = []
    monkeypatch.setattr(server, "_malloc_trim", lambda: lambda pad: trims.append(pad) or 1)
    guard = server.ConnectionGuard(max_connections=10, header_timeout_s=1.0)

    async def scenario() -> list[int]:
        task = server.give_back_freed_memory(guard, every_s=0.1)
        assert task is not None and guard.trimmer is task
        counts = []
        await asyncio.sleep(0.35)
        counts.append(len(trims))  # no connection activity: nothing to give back
        guard.activity += 5  # a burst
        await asyncio.sleep(0.35)
        counts.append(len(trims))  # given back once, not once per period
        task.cancel()
        return counts

    assert asyncio.run(scenario()) == [0, 1]
    assert trims == [0]
