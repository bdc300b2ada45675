"""Helpers for the break-it tests: scores to record, and a store on a temporary SQLite file.

Import what you use: ``from breakit_conftest import sqlite_store, scores``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from dialogue_safety.breakit.store import BreakItStore, Scores, open_store
from dialogue_safety.core.schema import Label


def scores(score: float, threshold: float = 0.5, model_id: str = "m@1", **references: float) -> Scores:
    return Scores(model_id, score, Label.from_bool(score >= threshold), threshold, references)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[BreakItStore]:
    store = open_store(tmp_path / "breakit.sqlite3", rng=random.Random(0))
    try:
        yield store
    finally:
        store.close()
