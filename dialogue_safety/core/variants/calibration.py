"""The calibration set of the static int8 variant: encoded model input rows, stored in the model directory.

Static quantisation fixes each activation's int8 range ahead of time from what the model computes on
real inputs. So that the service can still derive the int8 variant at start without the datasets
(and derive the same bytes every time), ``dialogue-safety export`` stores a few hundred encoded
validation dialogues in the model directory (:data:`dialogue_safety.core.model_dir.CALIBRATION_FILE`):
token ids and segment ids only (no text), both rows of a ``"decomposed"`` encoding, ~100 KB.

    save_calibration(path, rows, sources)      # export
    calibration_feeds(path)                    # derivation: one feed dict per row, in file order
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.encoding import EncodedExample, pad_batch

FORMAT_VERSION = 1


class CalibrationError(ValueError):
    """The calibration file is missing, unreadable or not what the recipe was validated with."""


def save_calibration(path: str | Path, rows: Sequence[EncodedExample], sources: Sequence[str]) -> Path:
    """Write ``rows`` (model input rows; their source names beside them) as a compressed ``.npz``.

    The bytes depend only on the rows and sources (fixed zip timestamps), so a re-export with the same
    data writes the same file and the recipe's sha256 of it stays the same.
    """
    if not rows or len(rows) != len(sources):
        raise CalibrationError(f"need one source per row and at least one row, got {len(rows)} rows, {len(sources)}")
    lengths = np.array([len(r) for r in rows], dtype=np.int32)
    arrays = {
        "input_ids": np.concatenate([np.asarray(r.input_ids, dtype=np.int32) for r in rows]),
        "token_type_ids": np.concatenate([np.asarray(r.token_type_ids, dtype=np.int8) for r in rows]),
        "lengths": lengths,
        "sources": np.array(list(sources), dtype=np.str_),
        "meta": np.array(json.dumps({"format": FORMAT_VERSION, "rows": len(rows)})),
    }
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buffer.getvalue())
    tmp.replace(target)
    return target


def load_calibration(path: str | Path) -> tuple[list[EncodedExample], list[str]]:
    """The rows and their sources (:class:`CalibrationError` when the file is missing or malformed)."""
    target = Path(path)
    if not target.is_file():
        raise CalibrationError(
            f"{target}: no calibration file; the static int8 variant needs the encoded calibration dialogues "
            "that `dialogue-safety export` writes into the model directory"
        )
    try:
        with np.load(target, allow_pickle=False) as data:
            ids, types, lengths = data["input_ids"], data["token_type_ids"], data["lengths"]
            sources = [str(s) for s in data["sources"]]
    except Exception as exc:  # zipfile/numpy errors of a damaged file
        raise CalibrationError(f"{target}: unreadable calibration file ({type(exc).__name__}: {exc})") from exc
    if int(lengths.sum()) != ids.size or ids.size != types.size or len(sources) != lengths.size:
        raise CalibrationError(f"{target}: inconsistent calibration arrays")
    rows: list[EncodedExample] = []
    start = 0
    for n in lengths.tolist():
        rows.append(
            EncodedExample(tuple(ids[start : start + n].tolist()), tuple(types[start : start + n].tolist()), (1,) * n)
        )
        start += n
    return rows, sources


def calibration_feeds(path: str | Path, pad_id: int = 0) -> list[dict[str, np.ndarray]]:
    """One ``{input_ids, attention_mask, token_type_ids}`` feed per row (batch of one: no padding, so
    padded positions never widen a range)."""
    rows, _ = load_calibration(path)
    return [pad_batch([row], pad_id) for row in rows]


class FeedReader:
    """onnxruntime's ``CalibrationDataReader`` protocol over a list of feeds."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]], input_names: Sequence[str] | None = None) -> None:
        names = set(input_names) if input_names else None
        self.feeds = [{k: v for k, v in f.items() if names is None or k in names} for f in feeds]
        self._it: Iterator[dict[str, Any]] = iter(self.feeds)

    def get_next(self) -> dict[str, Any] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self.feeds)
