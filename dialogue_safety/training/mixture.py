"""The multi-task mixture: which examples a training epoch draws, and in which batches.

* Each task's examples are drawn ``weight × round_weight`` times per epoch on average (the
  integer part deterministically, the fractional part by a seeded coin), so a weight is an
  upsampling factor: the BBF mixing parameter, and Dynabench-style upsampling of later rounds.
* Batches use length bucketing: shuffle, cut into buckets of ``bucket_size`` batches, sort
  each bucket by encoded length, cut into batches, shuffle the batch order. Batches are padded
  to their own longest example, never to ``max_length``.
* An epoch's plan depends only on (seed, epoch), so a resumed run replays the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.training.recipe import TaskSpec


@dataclass
class TaskData:
    spec: TaskSpec
    train: list[LabelledExample]
    valid: list[LabelledExample]
    test: list[LabelledExample]


def draw_counts(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """How many times each example is drawn this epoch (expected value = its weight)."""
    base = np.floor(weights).astype(int)
    frac = weights - base
    return base + (rng.random(weights.shape) < frac).astype(int)


def example_weights(tasks: Sequence[TaskData]) -> list[np.ndarray]:
    return [
        np.array([t.spec.weight * t.spec.round_weights.get(str(ex.round), 1.0) for ex in t.train], dtype=float)
        for t in tasks
    ]


def epoch_batches(
    lengths: np.ndarray,
    weights: np.ndarray,
    batch_size: int,
    bucket_size: int,
    seed: int,
    epoch: int,
) -> list[np.ndarray]:
    """Index batches (into the flat training list) for one epoch."""
    rng = np.random.default_rng([seed, epoch])
    counts = draw_counts(weights, rng)
    idx = np.repeat(np.arange(lengths.size), counts)
    rng.shuffle(idx)
    per_bucket = batch_size * bucket_size
    batches: list[np.ndarray] = []
    for start in range(0, idx.size, per_bucket):
        bucket = idx[start : start + per_bucket]
        bucket = bucket[np.argsort(lengths[bucket], kind="stable")]
        batches.extend(bucket[i : i + batch_size] for i in range(0, bucket.size, batch_size))
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def expected_steps_per_epoch(weights: np.ndarray, batch_size: int) -> int:
    return max(1, int(np.ceil(weights.sum() / batch_size)))
