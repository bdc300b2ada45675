"""The recipe's tasks read from the data directory: each task's train, valid and test examples.

Malformed files raise; a missing or sample-only source fails a required task and skips an optional one (named).
Evaluation-only suites (HateCheck) are never trained on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dialogue_safety.core.schema import LabelledExample, Split
from dialogue_safety.sources import registry
from dialogue_safety.training.mixture import TaskData
from dialogue_safety.training.recipe import Recipe

EVAL_ONLY_SOURCES = frozenset({"hatecheck"})


class DataError(RuntimeError):
    """The recipe asks for data that is missing or only a format sample."""


def _subsample(examples: list[LabelledExample], limit: int | None, seed: int) -> list[LabelledExample]:
    if limit is None or len(examples) <= limit:
        return examples
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(examples), size=limit, replace=False))
    return [examples[i] for i in keep]


def load_task_data(recipe: Recipe, data_dir: Path) -> tuple[list[TaskData], list[str]]:
    """Load every task of the recipe; missing/sample-only optional tasks are skipped (and named)."""
    for spec in recipe.tasks:
        if spec.source in EVAL_ONLY_SOURCES:
            raise DataError(f"task {spec.name!r}: {spec.source} is an evaluation-only suite; never train on it")
    # the one missing/malformed policy: malformed files raise; what is missing is decided per task below
    present = registry.load_present_sources(dict.fromkeys(spec.source for spec in recipe.tasks), data_dir)
    tasks: list[TaskData] = []
    skipped: list[str] = []
    for spec in recipe.tasks:
        if spec.source not in present.examples:
            problem = f"{spec.source} in {data_dir}: {present.skipped[spec.source]}"
            if spec.required:
                raise DataError(f"task {spec.name!r}: {problem}")
            skipped.append(f"{spec.name}: {problem}")
            continue
        rows = [
            ex
            for ex in present.examples[spec.source]
            if (spec.task is None or ex.task_name == spec.task)
            and (spec.rounds is None or str(ex.round) in spec.rounds)
        ]
        split = {s: [ex for ex in rows if ex.split == s] for s in Split}
        train_rows = _subsample(split[Split.TRAIN], recipe.max_examples_per_task, recipe.seed)
        if not train_rows:
            raise DataError(f"task {spec.name!r} has no training examples in {data_dir}")
        tasks.append(TaskData(spec, train_rows, split[Split.VALID], split[Split.TEST]))
    if not tasks:
        raise DataError(f"none of the recipe's tasks has data in {data_dir}")
    # the general-moderation guard measures recall: each floored task needs validation positives
    valid_positives = {t.spec.name for t in tasks if any(ex.label.is_positive for ex in t.valid)}
    unmeasured = sorted(set(recipe.general_recall_floors) - valid_positives)
    if unmeasured:
        raise DataError(
            f"general_recall_floors {unmeasured}: no validation positives in {data_dir} to measure recall on "
            "(a skipped optional task, or a source without a validation split)"
        )
    return tasks, skipped
