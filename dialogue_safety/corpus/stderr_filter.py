"""Known-harmless lines dropped from the process's standard error while a block runs.

Ray writes some lines on every successful run that read like failures: its C++ core worker logs an
``E … core_worker.cc`` "error" about actor constructor arguments held in the object store (Ray Data's
actor pool restarts actors; the model arrives that way by design), and it announces token
authentication for the local cluster it starts. They come from C++ and from Python alike, so they
are filtered at the file descriptor (fd 2 goes through a pipe to a thread that forwards every byte
except complete lines matching a pattern) and at the logging handlers (a Python record may be
written to a stream that is not fd 2). Partial lines (progress bars redrawn with ``\\r``) are
forwarded as they come. If the block fails, the dropped lines are written after all (nothing is
hidden from a failed run).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: Ray's lines on a successful ``score --engine ray`` run that are not problems
RAY_HARMLESS = (
    re.compile(r"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store"),
    re.compile(r"Token authentication is enabled for this Ray cluster"),
    re.compile(r"Progress bars disabled\. To enable, set"),  # the user asked for --no-progress
)


@contextmanager
def dropping(patterns: Sequence[re.Pattern[str]], fd: int = 2) -> Iterator[list[str]]:
    """Forward ``fd`` (standard error) as it is, without the complete lines matching one of ``patterns``;
    yields the list of the lines dropped so far."""
    sys.stderr.flush()
    original = os.dup(fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    dropped: list[str] = []
    forwarder = threading.Thread(
        target=_forward, args=(read_end, original, patterns, dropped), name="stderr-filter", daemon=True
    )
    forwarder.start()
    records = _RecordFilter(patterns, dropped)
    handlers = {h for name in ("", "ray") for h in logging.getLogger(name).handlers}
    for handler in handlers:
        handler.addFilter(records)
    failed = False
    try:
        yield dropped
    except BaseException:
        failed = True
        raise
    finally:
        for handler in handlers:
            handler.removeFilter(records)
        sys.stderr.flush()
        os.dup2(original, fd)  # our copy of the pipe's write end is gone: the forwarder ends at EOF
        forwarder.join(2.0)  # (a child process that inherited fd 2 may keep the pipe open: not waited for)
        if failed:
            os.write(fd, "".join(line + "\n" for line in dropped).encode(errors="replace"))


class _RecordFilter(logging.Filter):
    def __init__(self, patterns: Sequence[re.Pattern[str]], dropped: list[str]) -> None:
        super().__init__()
        self.patterns, self.dropped = patterns, dropped
        self._last: logging.LogRecord | None = None  # one record meets every handler: noted once

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not any(p.search(message) for p in self.patterns):
            return True
        if record is not self._last:
            self._last = record
            self.dropped.append(message)
        return False


def _forward(read_end: int, out: int, patterns: Sequence[re.Pattern[str]], dropped: list[str]) -> None:
    pending = b""
    try:
        while chunk := os.read(read_end, 65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            keep = [line for line in lines if not _harmless(line, patterns, dropped)]
            out_bytes = b"".join(line + b"\n" for line in keep)
            cut = pending.rfind(b"\r")
            if cut >= 0:  # a progress bar redrawn in place: forward it now
                out_bytes, pending = out_bytes + pending[: cut + 1], pending[cut + 1 :]
            if out_bytes:
                os.write(out, out_bytes)
        if pending and not _harmless(pending, patterns, dropped):
            os.write(out, pending)
    finally:
        os.close(read_end)
        os.close(out)


def _harmless(line: bytes, patterns: Sequence[re.Pattern[str]], dropped: list[str]) -> bool:
    text = line.decode(errors="replace")
    if any(p.search(text) for p in patterns):
        dropped.append(text)
        return True
    return False
