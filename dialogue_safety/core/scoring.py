"""From logits to calibrated scores: the one place that turns model outputs into a decision.

Each head (label family) emits one binary logit. Its calibrated probability is
``sigmoid(logit / T_head)``; the main OFFENSIVE score is the max over ``card.score_heads``.
:func:`threshold_in_force` says which threshold applies to a request and :func:`is_offensive` is
the one decision rule; every caller (API, runtime, training metrics, evaluation) uses them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import Label, Prediction, Reading

NO_CONTEXT_LOGIT = -40.0  # a context head's logit for an example without history: probability ~0
RowLogits = Callable[[Sequence[EncodedExample]], np.ndarray]  # model rows -> their [rows, heads] logits


def decomposed_logits(encoded: Sequence[EncodedExample], run: RowLogits, context_cols: Sequence[int]) -> np.ndarray:
    """[n, heads] logits of examples, each head read from its own row (``context_mode="decomposed"``)
    and, over a long utterance, the maximum over that row's windows.

    ``run`` maps rows to [rows, heads] logits; it is called once for the dialogue rows (every
    window of every example) and once for the utterance-alone rows. The context heads
    (``context_cols``) are read from the dialogue row, and are :data:`NO_CONTEXT_LOGIT` for an
    example without history (no context, no harm from it); every other head from the
    utterance-alone row (``EncodedExample.alone``), which for an example without history is its
    one row. Without alone rows this is ``run`` over the windows, each head's maximum per example.

    The maximum: a long message is as offensive as its worst part (an insult does not become
    less of one for the friendly paragraphs around it); measured in docs/runtime.md, "Long messages".
    """
    logits = _max_over_windows(encoded, run)
    if not context_cols or len(encoded) == 0:
        return logits
    with_alone = [i for i, e in enumerate(encoded) if e.alone is not None]
    utterance_cols = [c for c in range(logits.shape[1]) if c not in set(context_cols)]
    if with_alone:
        alone = _max_over_windows([encoded[i].alone for i in with_alone], run)  # type: ignore[misc]
        logits[np.ix_(with_alone, utterance_cols)] = alone[:, utterance_cols]
    without = [i for i, e in enumerate(encoded) if e.alone is None]
    if without:
        logits[np.ix_(without, list(context_cols))] = NO_CONTEXT_LOGIT
    return logits


def _max_over_windows(
    encoded: Sequence[EncodedExample], run: Callable[[Sequence[EncodedExample]], np.ndarray]
) -> np.ndarray:
    """[n, heads] logits: ``run`` over every window of the examples, each head's maximum per example."""
    if all(not e.more for e in encoded):
        return np.array(run(encoded), dtype=np.float32, copy=True)
    rows = [w for e in encoded for w in e.rows]
    starts = np.cumsum([0] + [len(e.rows) for e in encoded[:-1]])
    return np.maximum.reduceat(np.asarray(run(rows), dtype=np.float32), starts, axis=0)


def context_columns(card: ModelCard) -> list[int]:
    """The logit columns read from the dialogue row (none unless the encoding is decomposed)."""
    if card.encoding_config.context_mode != "decomposed":
        return []
    return [card.heads.index(h) for h in card.context_heads]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # numerically stable for large |x|


def head_probabilities(logits: np.ndarray, card: ModelCard) -> np.ndarray:
    """[n, heads] calibrated probabilities from [n, heads] logits."""
    logits = np.asarray(logits, dtype=np.float64)
    if logits.ndim != 2 or logits.shape[1] != len(card.heads):
        raise ValueError(f"expected logits of shape [n, {len(card.heads)}], got {logits.shape}")
    temps = np.array([card.temperature(h) for h in card.heads], dtype=np.float64)
    return sigmoid(logits / temps)


def main_scores(probs: np.ndarray, card: ModelCard) -> np.ndarray:
    idx = [card.heads.index(h) for h in card.score_heads]
    return probs[:, idx].max(axis=1)


def near_thresholds(scores: np.ndarray, thresholds: Iterable[float], band: float) -> np.ndarray:
    """Where ``scores`` lie within ``band`` of one of ``thresholds`` (strictly): the dialogues the int8
    check scores again with fp32 (:attr:`dialogue_safety.core.model_card.ModelCard.int8_check_band`)."""
    scores = np.asarray(scores)
    near = np.zeros(scores.shape, dtype=bool)
    for t in thresholds:
        near |= np.abs(scores - t) < band
    return near


def is_offensive(scores: ArrayLike, threshold: ArrayLike) -> np.ndarray:
    """The one decision rule: OFFENSIVE where ``score >= threshold`` (scalars or broadcast arrays)."""
    return np.greater_equal(scores, threshold)


def threshold_in_force(
    card_threshold: float,
    setting: float | None = None,
    request: float | None = None,
    item: float | None = None,
) -> float:
    """The decision threshold that applies: a batch item's own > the request's > the service
    setting (``SAFETY_THRESHOLD``) > the model card's (tuned on validation)."""
    for value in (item, request, setting):
        if value is not None:
            return float(value)
    return float(card_threshold)


def predictions_from_logits(
    logits: np.ndarray,
    card: ModelCard,
    threshold: float | None = None,
    reads: Sequence[Reading] | None = None,
) -> list[Prediction]:
    """Predictions from [n, heads] logits; ``reads``: what was read of each example (its encoding's)."""
    t = card.threshold if threshold is None else float(threshold)
    reads = reads if reads is not None else [Reading()] * len(logits)
    probs = head_probabilities(logits, card)
    scores = main_scores(probs, card)
    heads: Sequence[str] = card.heads
    return [
        Prediction(
            score=float(s),
            label=Label.from_bool(bool(is_offensive(s, t))),
            threshold=t,
            categories={h: float(p) for h, p in zip(heads, row, strict=True)},
            read=read,
        )
        for s, row, read in zip(scores, probs, reads, strict=True)
    ]
