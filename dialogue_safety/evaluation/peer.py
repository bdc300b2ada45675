"""A peer row for the evaluation tables: the bag-of-words library ``alt-profanity-check``.

A widely used drop-in offensive-language filter (linear SVM over bag-of-words, trained on
Wikipedia Toxic Comments and Davidson et al.'s tweets). It reads the utterance only and returns a
probability; its own decision rule is 0.5. Optional: installed with the ``train`` extra.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dialogue_safety.core.schema import Example

PEER_PACKAGE = "alt-profanity-check"


class ProfanityCheckScorer:
    """:class:`dialogue_safety.evaluation.scorers.Scorer` over ``profanity_check.predict_prob`` (utterance only)."""

    name = "alt-profanity-check"
    threshold = 0.5

    def __init__(self) -> None:
        try:
            from profanity_check import predict_prob
        except ImportError:
            raise ImportError(f"the peer row needs the package {PEER_PACKAGE}: pip install {PEER_PACKAGE}") from None
        self._predict = predict_prob

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        return np.asarray(self._predict([e.utterance for e in examples]), dtype=float)
