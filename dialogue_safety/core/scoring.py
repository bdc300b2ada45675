"""From logits to calibrated scores: the one place that turns model outputs into a decision.

Each head (label family) emits one binary logit. Its calibrated probability is
``sigmoid(logit / T_head)``; the main OFFENSIVE score is the max over ``card.score_heads``.
:func:`threshold_in_force` says which threshold applies to a request and :func:`is_offensive` is
the one decision rule; every caller (API, runtime, training metrics, evaluation) uses them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import ArrayLike

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import Label, Prediction

NO_CONTEXT_LOGIT = -40.0  # a context head's logit for an example without history: probability ~0


def decomposed_logits(
    encoded: Sequence[EncodedExample],
    run: Callable[[Sequence[EncodedExample]], np.ndarray],
    context_cols: Sequence[int],
) -> np.ndarray:
    """[n, heads] logits of examples, each head read from its own row (``context_mode="decomposed"``).

    ``run`` maps rows to [rows, heads] logits. The context heads (``context_cols``) are read from the
    dialogue row, and are :data:`NO_CONTEXT_LOGIT` for an example without history (no context, no
    harm from it); every other head from the utterance-alone row (``EncodedExample.alone``), which
    for an example without history is its one row. Without alone rows this is ``run(encoded)``.
    """
    logits = np.array(run(encoded), dtype=np.float32, copy=True)
    if not context_cols or len(encoded) == 0:
        return logits
    with_alone = [i for i, e in enumerate(encoded) if e.alone is not None]
    utterance_cols = [c for c in range(logits.shape[1]) if c not in set(context_cols)]
    if with_alone:
        alone = run([encoded[i].alone for i in with_alone])  # type: ignore[misc]
        logits[np.ix_(with_alone, utterance_cols)] = alone[:, utterance_cols]
    without = [i for i, e in enumerate(encoded) if e.alone is None]
    if without:
        logits[np.ix_(without, list(context_cols))] = NO_CONTEXT_LOGIT
    return logits


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


def predictions_from_logits(logits: np.ndarray, card: ModelCard, threshold: float | None = None) -> list[Prediction]:
    t = card.threshold if threshold is None else float(threshold)
    probs = head_probabilities(logits, card)
    scores = main_scores(probs, card)
    heads: Sequence[str] = card.heads
    return [
        Prediction(
            score=float(s),
            label=Label.from_bool(bool(is_offensive(s, t))),
            threshold=t,
            categories={h: float(p) for h, p in zip(heads, row, strict=True)},
        )
        for s, row in zip(scores, probs, strict=True)
    ]
