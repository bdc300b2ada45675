"""Where the datasets live: ``--data-dir``, else ``$DIALOGUE_SAFETY_DATA_DIR``, else ``../shared/data``."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "DIALOGUE_SAFETY_DATA_DIR"
_FALLBACKS = (Path("../shared/data"), Path(__file__).resolve().parents[3] / "shared" / "data")


def resolve_data_dir(explicit: str | Path | None = None) -> Path:
    """Return the data directory, or raise FileNotFoundError saying how to provide one."""
    if explicit is not None:
        path = Path(explicit).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"data directory {path} does not exist")
        return path
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"${DATA_DIR_ENV}={env} is not a directory")
        return path
    for candidate in _FALLBACKS:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no data directory: pass --data-dir DIR or set ${DATA_DIR_ENV} (see docs/data.md)")
