"""The batching budget: one knob, one default, one rule that forms inference batches.

``max_batch_tokens`` (like text-embeddings-inference's ``--max-batch-tokens``) bounds the padded
tokens of one inference call: batch size × longest example. Every caller that cuts examples into
inference batches does it with :func:`token_budget_batches`: the micro-batcher (the batches the
service runs), the runtime (a direct ``predict`` call larger than one batch), torch inference on
a checkpoint and the benchmarks.

On CPU, one big batch padded to its longest dialogue wastes most of its work on padding: MiniLM,
dialogue test data, 2 cores, length-sorted pieces of 1024 padded tokens gave ~2.2x the items/s of
pieces of 8192 (docs/api.md, "How requests are batched"). Raise it on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

#: padded tokens per inference call at most (the service's ``SAFETY_MAX_BATCH_TOKENS``)
MAX_BATCH_TOKENS = 1024
#: items per inference batch at most (the service's ``SAFETY_MAX_BATCH_SIZE``; the runtime's and torch
#: inference's default too): with ``MAX_BATCH_TOKENS`` it only binds for items under 16 tokens
MAX_BATCH_SIZE = 64


def fits(n_items: int, longest: int, max_batch_tokens: int, max_batch_size: int) -> bool:
    """True when ``n_items`` examples whose longest has ``longest`` tokens make one batch."""
    return n_items <= 1 or (n_items <= max_batch_size and n_items * longest <= max_batch_tokens)


def token_budget_batches(
    lengths: Sequence[int] | np.ndarray,
    max_batch_tokens: int,
    max_batch_size: int,
    rows: Sequence[int] | np.ndarray | None = None,
) -> Iterator[np.ndarray]:
    """Indices sorted longest first, cut so that batch size × longest ≤ ``max_batch_tokens``.

    ``rows``: model rows per item (the windows of a long utterance, :attr:`EncodedExample.rows
    <dialogue_safety.core.encoding.EncodedExample.rows>`); the budget then counts rows × longest.
    An item longer than the budget gets a batch of its own.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    start, n = 0, order.size
    if rows is None or all(int(r) == 1 for r in rows):
        while start < n:
            width = int(lengths[order[start]])
            size = max(1, min(max_batch_size, max_batch_tokens // max(width, 1), n - start))
            yield order[start : start + size]
            start += size
        return
    weights = np.asarray(rows, dtype=np.int64)
    while start < n:
        width = max(int(lengths[order[start]]), 1)
        end, used = start + 1, int(weights[order[start]])
        while end < n and end - start < max_batch_size:
            more = int(weights[order[end]])
            if (used + more) * width > max_batch_tokens:
                break
            used += more
            end += 1
        yield order[start:end]
        start = end
