"""Label semantics that do not fight: what each head learns from each source's labels.

The served decision follows BBF's definition of OFFENSIVE (not OK to send in a friendly
conversation with someone you just met online): insults, threats, harassment and profanity at
anyone; hate against a group; and, in context, agreeing with or encouraging harm. The sources
label narrower or different things (:class:`~dialogue_safety.core.schema.LabelFamily`), so with
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

**Decomposed** (``encoding.context_mode = "decomposed"``, model 0.4.0): the ``offensive`` and
``hateful`` heads read the utterance alone and learn what the utterance says by itself; the
``unsafe_in_context`` head (:data:`CONTEXT_HEAD`) reads the dialogue and learns only what the
context decides. The served score is the max of ``offensive`` and ``unsafe_in_context``. Targets:

============================  ==================  ==================  ====================
example (family, label)       ``offensive``       ``hateful``         ``unsafe_in_context``
============================  ==================  ==================  ====================
offensive +                   1                   --                  --
offensive -                   0                   0                   0 (with history)
hateful +                     1                   1                   --
hateful - (no abuse)          0                   0                   0 (with history)
hateful - (abusive teacher)   --                  0                   --
unsafe_in_context +           -- (1 alone)        --                  1
unsafe_in_context -           0                   0                   0
unsafe_in_context - (*)       --                  --                  0
============================  ==================  ==================  ====================

**Attribute heads** (:data:`ATTRIBUTE_HEADS`: ``violence``, ``unsafe_request``) exist when a
training source labels the attribute on every row (``metadata["violence"]``: the Gab Hate
Corpus's calls for violence, EDOS's threats; ``metadata["unsafe_request"]``: ToxicChat's prompts
and the written requests). Such an example teaches the head its bool, whatever its family; every
other example leaves the head masked. They read the utterance alone and are reported as
categories; the served score stays the larger of ``offensive`` and ``unsafe_in_context``.

An offensive utterance is the utterance heads' to catch, so it teaches the context head nothing;
a harmless reply teaches it 0 whatever came before (that is what keeps a hostile turn from
tainting the reply); an unsafe-in-context reply (encouraging harm, agreeing with hate) is 1 for
the context head and says nothing about the utterance alone. (*) Replies whose source says only
that they do not endorse the context (counter-speech that may itself be rude, "neutral" replies:
``metadata[UTTERANCE_UNLABELLED]``) teach the context head 0 and the utterance heads nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dialogue_safety.core.schema import (
    UNSAFE_REQUEST,
    UTTERANCE_UNLABELLED,
    VIOLENCE,
    LabelFamily,
    LabelledExample,
)

HARMONISED = "harmonised"
# attribute heads: taught only by the sources that label the attribute on every row (metadata[head], a bool)
ATTRIBUTE_HEADS = (VIOLENCE, UNSAFE_REQUEST)
HEAD_ORDER = ("offensive", "hateful", "unsafe_in_context", *ATTRIBUTE_HEADS)
SERVED_HEAD = "offensive"
CONTEXT_HEAD = "unsafe_in_context"  # the head that reads the dialogue in a decomposed model
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


class _Targets:
    """[n, heads] targets and loss masks, written one (example, head) at a time; heads not in the
    layout are ignored."""

    def __init__(self, n: int, heads: Sequence[str]) -> None:
        self.y = np.zeros((n, len(heads)), dtype=np.float32)
        self.mask = np.zeros_like(self.y)
        self.col = {h: i for i, h in enumerate(heads)}

    def put(self, i: int, head: str, value: float) -> None:
        if head in self.col:
            self.y[i, self.col[head]], self.mask[i, self.col[head]] = value, 1.0


def _put_attributes(put: Callable[[int, str, float], None], i: int, ex: LabelledExample) -> None:
    """The attribute heads' targets: what the example's source says of the utterance, where it says it."""
    for head in ATTRIBUTE_HEADS:
        if head in ex.metadata:
            put(i, head, float(bool(ex.metadata[head])))


def attribute_heads(examples: Iterable[LabelledExample]) -> set[str]:
    """The attribute heads some example teaches."""
    return {head for ex in examples for head in ATTRIBUTE_HEADS if head in ex.metadata}


def harmonised_targets(
    examples: Sequence[LabelledExample], heads: Sequence[str], abusive: np.ndarray, decomposed: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """[n, heads] targets and loss masks by the tables in the module docstring."""
    if decomposed:
        return _decomposed_targets(examples, heads, abusive)
    targets = _Targets(len(examples), heads)
    put = targets.put
    for i, ex in enumerate(examples):
        _put_attributes(put, i, ex)
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
            if pos or not ex.metadata.get(UTTERANCE_UNLABELLED):  # a rude counter may still be offensive
                put(i, "offensive", pos)
            if not pos and not ex.metadata.get(UTTERANCE_UNLABELLED):
                put(i, "hateful", 0.0)
    return targets.y, targets.mask


def _decomposed_targets(
    examples: Sequence[LabelledExample], heads: Sequence[str], abusive: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    targets = _Targets(len(examples), heads)
    put = targets.put
    for i, ex in enumerate(examples):
        _put_attributes(put, i, ex)
        pos = float(ex.label.is_positive)
        context = bool(ex.history)
        family = ex.family
        if family is LabelFamily.OFFENSIVE:
            put(i, "offensive", pos)
            if not pos:
                put(i, "hateful", 0.0)
                if context:
                    put(i, CONTEXT_HEAD, 0.0)
        elif family is LabelFamily.HATEFUL:
            put(i, "hateful", pos)
            if pos or not abusive[i]:
                put(i, "offensive", pos)
                if context and not pos:
                    put(i, CONTEXT_HEAD, 0.0)
        else:  # UNSAFE_IN_CONTEXT
            if context:
                put(i, CONTEXT_HEAD, pos)
            if pos and not context:
                put(i, "offensive", 1.0)
            if not pos and not ex.metadata.get(UTTERANCE_UNLABELLED):
                put(i, "offensive", 0.0)
                put(i, "hateful", 0.0)
    return targets.y, targets.mask


def served_gold_from_targets(
    y: np.ndarray, mask: np.ndarray, heads: Sequence[str], decomposed: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Gold for the served score and which examples have one, from the per-head targets.

    Harmonised: the ``offensive`` head's target. Decomposed: OFFENSIVE when the utterance is
    offensive or the context head's target is 1; SAFE only when the utterance is known to be
    harmless and the reply is not unsafe in its context (a reply labelled only "does not endorse"
    has no served gold: it may still be rude).
    """
    c = list(heads).index(SERVED_HEAD)
    gold, keep = y[:, c].astype(int), mask[:, c] > 0
    if decomposed and CONTEXT_HEAD in heads:
        k = list(heads).index(CONTEXT_HEAD)
        unsafe = (mask[:, k] > 0) & (y[:, k] > 0)
        gold = np.where(unsafe, 1, gold)
        keep = keep | unsafe
    return gold, keep
