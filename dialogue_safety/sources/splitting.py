"""Split names and deterministic split assignment.

Official splits are always kept. Where a source has none (the Kaggle train.csv) or lacks one
(the DynaHate subset has no train split), the assignment is a pure function of a key: the
first 8 bytes of ``sha256(salt + ":" + key)`` read as a fraction in [0, 1). It does not depend
on Python's ``hash()`` (salted per process), on row order or on which other rows are present.
"""

from __future__ import annotations

import hashlib

from dialogue_safety.core.schema import Split

_SPLIT_NAMES: dict[str, Split] = {
    "train": Split.TRAIN,
    "valid": Split.VALID,
    "validation": Split.VALID,
    "val": Split.VALID,
    "dev": Split.VALID,
    "test": Split.TEST,
}


def parse_split(name: str) -> Split | None:
    """``train``/``valid``/``test`` and the aliases ``dev``/``val``/``validation``; None if unknown."""
    return _SPLIT_NAMES.get(name.strip().lower())


def split_names() -> str:
    return ", ".join(_SPLIT_NAMES)


def stable_fraction(key: str, salt: str) -> float:
    """A fraction in [0, 1) that depends only on ``salt`` and ``key``."""
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def three_way_split(key: str, salt: str, valid: float = 0.1, test: float = 0.1) -> Split:
    """TRAIN / VALID / TEST with probabilities ``1 - valid - test`` / ``valid`` / ``test``."""
    x = stable_fraction(key, salt)
    if x < 1.0 - valid - test:
        return Split.TRAIN
    return Split.VALID if x < 1.0 - test else Split.TEST
