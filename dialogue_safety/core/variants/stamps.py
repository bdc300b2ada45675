"""What a derived ONNX file says about itself, and writing it whole.

A derived file is stamped (ONNX ``metadata_props`` under :data:`META`) with the artifact's
sha256, the recipe and the onnxruntime version, and written to a temporary file then renamed
into place (:func:`save_atomic`), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import onnx

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
    return get_meta(onnx.load(str(path), load_external_data=False))


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
