"""The model directory and the training checkpoint: their file names, and which one a path is.

The one owner of these names (DESIGN.md, house style 1). A *model directory* (what `export`
writes and the service serves) holds the ONNX artifact, the tokenizer and the JSON card (plus
the human-readable card and derived variants); a *training checkpoint* holds the Hugging Face
weights and config beside the same tokenizer and card. Torch-free: commands ask here whether a
path is one or the other (:func:`kind`), or what is wrong with it (:func:`model_dir_problem`),
before importing anything heavy. It also knows where the bundled model is (:func:`default_model_dir`).
"""

from __future__ import annotations

import os
import sysconfig
from contextlib import suppress
from pathlib import Path
from typing import Literal

ARTIFACT_FILE = "model.onnx"  # the committed ONNX artifact; variants are derived from it
CARD_FILE = "model_card.json"  # dialogue_safety.core.model_card.ModelCard
CARD_MARKDOWN_FILE = "MODEL_CARD.md"  # rendered from the card (dialogue_safety.export.card_markdown)
TOKENIZER_FILE = "tokenizer.json"
#: the Hugging Face files of a training checkpoint (the tokenizer and the card sit beside them)
CHECKPOINT_FILES: tuple[str, ...] = ("config.json", "model.safetensors")
CHECKPOINT_CONFIG_FILE = CHECKPOINT_FILES[0]
#: the variants derived from the artifact (dialogue_safety.core.variants), cached beside it, never committed
VARIANT_FILES: dict[str, str] = {
    "fp32": "model.fp32.onnx",  # only when model.onnx stores fp16 weights; else fp32 *is* model.onnx
    "optimized": "model.optimized.onnx",
    "int8": "model.int8.onnx",
    "fp16": "model.fp16.onnx",
}
#: encoded validation dialogues (token ids only, a few hundred rows) that calibrate the static int8 variant's
#: activation ranges when it is derived at start (dialogue_safety.core.variants.calibration); committed
CALIBRATION_FILE = "calibration.npz"
VARIANT_LOCK_FILE = ".variants.lock"  # taken while a variant is derived (dialogue_safety.core.variants.cache)
STAMP_INDEX_FILE = (
    ".stamps.json"  # what the ONNX files here say about themselves (dialogue_safety.core.variants.stamps)
)
#: what a shipped model directory's .gitignore leaves out: every derived file
DERIVED_PATTERNS: tuple[str, ...] = ("model.*.onnx", ".*.tmp", VARIANT_LOCK_FILE, STAMP_INDEX_FILE)

Kind = Literal["onnx", "checkpoint"]


def is_model_dir(path: str | Path) -> bool:
    """A directory with a model card (an exported model directory or a checkpoint)."""
    return (Path(path) / CARD_FILE).is_file()


def is_checkpoint(path: str | Path) -> bool:
    return all((Path(path) / f).is_file() for f in CHECKPOINT_FILES)


def kind(path: str | Path) -> Kind:
    """``"onnx"`` for an exported model directory, ``"checkpoint"`` for a training checkpoint."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: model directory does not exist")
    if (directory / ARTIFACT_FILE).is_file():
        return "onnx"
    if is_checkpoint(directory):
        return "checkpoint"
    raise ValueError(
        f"{directory}: neither an exported model directory (needs {ARTIFACT_FILE}) nor a training "
        f"checkpoint (needs {' + '.join(CHECKPOINT_FILES)})"
    )


def model_dir_problem(path: str | Path) -> str | None:
    """One line saying why ``path`` is not an exported model directory, or None when it looks like one."""
    directory = Path(path)
    if not directory.is_dir():
        return f"no model directory at {directory}"
    if not (directory / CARD_FILE).is_file():
        return f"{directory} has no {CARD_FILE}: not an exported model directory"
    if not any(directory.glob("*.onnx")):
        return f"{directory} has no .onnx file: export the checkpoint first"
    return None


#: where the bundled model lives, relative to a source checkout and to an installation's data prefix
BUNDLED_MODEL = Path("models") / "default"
INSTALLED_MODEL = Path("share") / "dialogue-safety" / BUNDLED_MODEL  # pyproject.toml [tool.setuptools.data-files]


def model_dir_candidates() -> list[Path]:
    """Where the bundled model is looked for, in order (``SAFETY_MODEL_DIR`` / ``--model`` come first).

    1. ``<source checkout>/models/default``: the repository this code runs from (editable installs);
    2. ``<prefix>/share/dialogue-safety/models/default``: installed with the package by ``pip install .``
       (the environment's data prefix, then the user scheme's for ``pip install --user``).
    """
    candidates = [Path(__file__).resolve().parents[2] / BUNDLED_MODEL]  # <checkout>/dialogue_safety/core/
    for scheme in (None, f"{os.name}_user"):
        with suppress(KeyError):
            data = sysconfig.get_path("data", scheme) if scheme else sysconfig.get_path("data")
            candidate = Path(data) / INSTALLED_MODEL
            if candidate not in candidates:
                candidates.append(candidate)
    return candidates


def default_model_dir() -> Path:
    """The first of :func:`model_dir_candidates` that exists (else the first, for the error message)."""
    candidates = model_dir_candidates()
    return next((c for c in candidates if c.is_dir()), candidates[0])
