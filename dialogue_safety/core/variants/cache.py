"""Where derived variants go when the model directory is read-only, and the lock that makes two
processes starting together derive a variant once.

The one reader of ``DIALOGUE_SAFETY_CACHE_DIR``. It is not a ``SAFETY_*`` service setting: the
derivation also runs in ``dialogue-safety export`` and in the Docker build, without the serving extra.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from dialogue_safety.core.model_dir import VARIANT_LOCK_FILE


def cache_root() -> Path:
    """Where derived variants go when the model directory is read-only.

    ``$DIALOGUE_SAFETY_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/dialogue-safety/variants``.
    """
    explicit = os.environ.get("DIALOGUE_SAFETY_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "dialogue-safety" / "variants"


@contextlib.contextmanager
def lock(directory: Path) -> Iterator[None]:
    """An exclusive lock so that two processes starting together derive a variant once."""
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic renames still keep every file whole
        yield
        return
    with open(directory / VARIANT_LOCK_FILE, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)
