"""The standard-error filter of ``score --engine ray``: known-harmless lines dropped at the file descriptor
(C++ and Python writes alike), everything else forwarded, the dropped lines shown after all on failure."""

from __future__ import annotations

import logging
import os
import re

import pytest

from dialogue_safety.corpus.stderr_filter import RAY_HARMLESS, dropping

CORE_WORKER = (
    "[2026-11-24 00:26:35,567 E 1771 1771] core_worker.cc:2465: Actor with class name: 'MapWorker(MapBatches"
    "(RowScorer))' and ID: '92' has constructor arguments in the object store and max_restarts > 0."
)
TOKEN = "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out."


def test_harmless_lines_are_dropped_and_the_rest_forwarded_in_order(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with dropping(RAY_HARMLESS) as dropped:
        os.write(2, f"first\n{CORE_WORKER}\n".encode())  # as the C++ core worker writes: to fd 2
        logging.getLogger("ray._private.authentication.authentication_token_setup").warning(TOKEN)  # Python
        os.write(2, b"progress 1/2\rprogress 2/2\r")  # a bar redrawn in place: no newline
        os.write(2, b"INFO a real line\nlast without a newline")
    err = capfd.readouterr().err
    assert err == "first\nprogress 1/2\rprogress 2/2\rINFO a real line\nlast without a newline"
    assert sorted(dropped) == sorted([CORE_WORKER, TOKEN])
    assert TOKEN not in caplog.text  # the record stopped at the handlers (pytest's among them)


def test_a_failed_block_shows_the_dropped_lines_after_all(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), dropping([re.compile("harmless")]):
        os.write(2, b"a harmless line\nkept\n")
        raise RuntimeError("the run failed")
    err = capfd.readouterr().err
    assert "kept\n" in err and "a harmless line\n" in err
