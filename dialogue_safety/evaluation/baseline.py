"""The baseline row of every table: TF-IDF (word 1–2-grams) + logistic regression.

Trained on the train splits of the sources the model was trained on, with the decision
threshold tuned for OFFENSIVE-F1 on their valid splits (``dialogue_safety.training.metrics.best_f1_threshold``).
The input is the history joined by spaces, then ``" [SEP] "``, then the utterance, so the
baseline sees the same context the model sees, as a bag of words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from dialogue_safety.core.schema import Example, LabelledExample
from dialogue_safety.training.metrics import best_f1_threshold

DEFAULT_TRAINING_SOURCES: tuple[str, ...] = ("diasafety", "convabuse", "hatemoji", "dynahate")
BASELINE_NAME = "TF-IDF + LR"


def baseline_text(example: Example) -> str:
    """``history joined + " [SEP] " + utterance`` (the history part is empty for single turns)."""
    return " ".join(t.text for t in example.history) + " [SEP] " + example.utterance


def gold(examples: Sequence[LabelledExample]) -> np.ndarray:
    """1 for OFFENSIVE, 0 for SAFE."""
    return np.array([int(e.label.is_positive) for e in examples], dtype=int)


class TfidfBaseline:
    """A fitted TF-IDF + logistic-regression scorer (implements ``dialogue_safety.evaluation.scorers.Scorer``)."""

    def __init__(
        self, vectorizer: TfidfVectorizer, classifier: LogisticRegression, threshold: float, name: str = BASELINE_NAME
    ) -> None:
        self.vectorizer = vectorizer
        self.classifier = classifier
        self.threshold = float(threshold)
        self.name = name
        self.info: dict[str, Any] = {}

    @classmethod
    def fit(
        cls,
        train: Sequence[LabelledExample],
        valid: Sequence[LabelledExample] = (),
        *,
        min_df: int = 2,
        c: float = 1.0,
        name: str = BASELINE_NAME,
    ) -> TfidfBaseline:
        """Fit on ``train``; tune the threshold on ``valid`` (0.5 when there is none)."""
        y = gold(train)
        if len(train) == 0 or len(np.unique(y)) < 2:
            raise ValueError(
                f"the baseline needs training examples of both classes, got {len(train)} ({int(y.sum())} OFFENSIVE)"
            )
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=min_df if len(train) >= 50 else 1, sublinear_tf=True)
        features = vectorizer.fit_transform([baseline_text(e) for e in train])
        classifier = LogisticRegression(C=c, max_iter=2000, solver="liblinear")
        classifier.fit(features, y)
        model = cls(vectorizer, classifier, 0.5, name)
        if len(valid):
            threshold, valid_f1 = best_f1_threshold(gold(valid), model.predict_proba(valid))
            model.threshold = threshold
        else:
            valid_f1 = None
        model.info = {
            "n_train": len(train),
            "n_train_offensive": int(y.sum()),
            "n_valid": len(valid),
            "vocabulary": len(vectorizer.vocabulary_),
            "threshold": model.threshold,
            "valid_offensive_f1": valid_f1,
        }
        return model

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        if not examples:
            return np.zeros(0)
        features = self.vectorizer.transform([baseline_text(e) for e in examples])
        return np.asarray(self.classifier.predict_proba(features)[:, 1], dtype=float)
