"""What a derived ONNX file says about itself, and writing it whole.

A derived file is stamped (ONNX ``metadata_props`` under :data:`META`) with the artifact's
sha256, the recipe and the onnxruntime version, and written to a temporary file then renamed
into place (:func:`save_atomic`), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from dialogue_safety.core.model_dir import STAMP_INDEX_FILE

META = "dialogue_safety."  # prefix of the metadata_props this project writes


def set_meta(model: onnx.ModelProto, values: Mapping[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in values.items():
        full = META + key
        if full in existing:
            existing[full].value = value
        else:
            prop = model.metadata_props.add()
            prop.key, prop.value = full, value


def get_meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key[len(META) :]: p.value for p in model.metadata_props if p.key.startswith(META)}


def read_stamp(path: str | Path) -> dict[str, str]:
    """The ``dialogue_safety.*`` metadata of an ONNX file (variant, artifact_sha256, recipe...)."""
    stamp: dict[str, str] = _remembered(
        Path(path), "stamp", lambda: get_meta(onnx.load(str(path), load_external_data=False))
    )
    return dict(stamp)


def file_sha256(path: str | Path) -> str:
    def digest_of() -> str:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return digest.hexdigest()

    sha: str = _remembered(Path(path), "sha256", digest_of)
    return sha


# Every start checks that the derived files still belong to the artifact: that hashes the artifact and
# parses each derived graph (tens of MB each), most of a warm start's loading. What they said is kept
# in STAMP_INDEX_FILE beside them, under the file's size, modification time and inode: a file that
# was rewritten (save_atomic renames a new file into place) or replaced is read again.
def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _remembered(path: Path, what: str, compute: Any) -> Any:
    index_path = path.parent / STAMP_INDEX_FILE
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        index = index if isinstance(index, dict) else {}
    except (OSError, ValueError):
        index = {}
    key = _file_key(path)
    entry = index.get(path.name) if isinstance(index.get(path.name), dict) else None
    if entry is not None and entry.get("key") == key and what in entry:
        return entry[what]
    value = compute()
    entry = entry if entry is not None and entry.get("key") == key else {"key": key}
    entry[what] = value
    index[path.name] = entry
    if os.access(path.parent, os.W_OK):  # a read-only directory (an image): computed each time
        with contextlib.suppress(OSError):
            fd, tmp = tempfile.mkstemp(prefix=f".{STAMP_INDEX_FILE}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(index, handle, sort_keys=True)
            os.replace(tmp, index_path)
    return value


def save_atomic(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    dest = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return dest
