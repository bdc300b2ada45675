"""The one seeded subsample of the suites: ``--limit`` per source split, and the history measures' samples."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dialogue_safety.core.schema import LabelledExample


def subsample(examples: Sequence[LabelledExample], limit: int | None, seed: int) -> list[LabelledExample]:
    """At most ``limit`` examples, drawn without replacement (order kept); all when no limit."""
    if limit is None or len(examples) <= limit:
        return list(examples)
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), size=limit, replace=False))
    return [examples[int(i)] for i in keep]
