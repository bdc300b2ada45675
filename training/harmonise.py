"""Label semantics that do not fight: what each head learns from each source's labels.

The served decision follows BBF's definition of OFFENSIVE (not OK to send in a friendly
conversation with someone you just met online): insults, threats, harassment and profanity at
anyone; hate against a group; and, in context, agreeing with or encouraging harm. The sources
label narrower or different things (:class:`~service.schema.LabelFamily`), so with
``heads = "harmonised"`` the model has three heads and each example teaches each head only what
its label really says:

============================  ==================  ==================  ====================
example (family, label)       ``offensive``       ``hateful``         ``unsafe_in_context``
============================  ==================  ==================  ====================
offensive +                   1                   --                  --
offensive -                   0                   0                   --
hateful +                     1                   1                   --
hateful - (no abuse)          0                   0                   --
hateful - (abusive teacher)   --                  0                   --
unsafe_in_context +           1                   --                  1
unsafe_in_context -           0                   0                   0
============================  ==================  ==================  ====================

(-- = masked out of the loss.) A hate dataset's "not hateful" is not "SAFE": abuse at a
non-protected target is not hateful but is offensive. Which of those negatives are abusive is
decided by a *teacher*: a TF-IDF + logistic regression fitted on the offensive-family training
examples (OLID, ConvAbuse...), which knows what an insult looks like whatever its target. Hate
negatives it scores at or above :data:`TEACHER_THRESHOLD` are masked for the ``offensive`` head
(neither positive nor negative); the others (benign identity mentions, counter-speech) stay
negatives, so "I love my muslim neighbours" is still taught as SAFE.

The served score is the ``offensive`` head (``card.score_heads``); ``categories`` report all
three. The same rules give the gold labels the threshold is tuned against on validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from service.schema import LabelFamily, LabelledExample

HARMONISED = "harmonised"
HEAD_ORDER = ("offensive", "hateful", "unsafe_in_context")
SERVED_HEAD = "offensive"
TEACHER_THRESHOLD = 0.5


@dataclass
class AbuseTeacher:
    """TF-IDF + logistic regression on offensive-family training texts: P(abusive | text)."""

    vectorizer: object
    model: object

    @classmethod
    def fit(cls, examples: Sequence[LabelledExample]) -> AbuseTeacher | None:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        texts = [ex.utterance for ex in examples if ex.family is LabelFamily.OFFENSIVE]
        gold = np.array([int(ex.label.is_positive) for ex in examples if ex.family is LabelFamily.OFFENSIVE])
        if len(texts) < 10 or len(np.unique(gold)) < 2:
            return None
        vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, lowercase=True)
        model = LogisticRegression(max_iter=1000, C=4.0, class_weight="balanced")
        model.fit(vectorizer.fit_transform(texts), gold)
        return cls(vectorizer, model)

    def scores(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0)
        return np.asarray(self.model.predict_proba(self.vectorizer.transform(list(texts)))[:, 1])  # type: ignore[attr-defined]


def abusive_hate_negatives(examples: Sequence[LabelledExample], teacher: AbuseTeacher | None) -> np.ndarray:
    """[n] bool: hate-family negatives the teacher calls abusive (masked for the offensive head)."""
    flags = np.zeros(len(examples), dtype=bool)
    idx = [i for i, ex in enumerate(examples) if ex.family is LabelFamily.HATEFUL and not ex.label.is_positive]
    if teacher is None or not idx:
        return flags
    flags[idx] = teacher.scores([examples[i].utterance for i in idx]) >= TEACHER_THRESHOLD
    return flags


def harmonised_targets(
    examples: Sequence[LabelledExample], heads: Sequence[str], abusive: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """[n, heads] targets and loss masks by the table in the module docstring."""
    y = np.zeros((len(examples), len(heads)), dtype=np.float32)
    mask = np.zeros_like(y)
    col = {h: i for i, h in enumerate(heads)}

    def put(i: int, head: str, value: float) -> None:
        if head in col:
            y[i, col[head]], mask[i, col[head]] = value, 1.0

    for i, ex in enumerate(examples):
        pos = float(ex.label.is_positive)
        family = ex.family
        if family is LabelFamily.OFFENSIVE:
            put(i, "offensive", pos)
            if not pos:
                put(i, "hateful", 0.0)
        elif family is LabelFamily.HATEFUL:
            put(i, "hateful", pos)
            if pos or not abusive[i]:
                put(i, "offensive", pos)
        else:  # UNSAFE_IN_CONTEXT
            put(i, "unsafe_in_context", pos)
            put(i, "offensive", pos)
            if not pos:
                put(i, "hateful", 0.0)
    return y, mask

