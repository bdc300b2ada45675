"""Word-level explanations of the served OFFENSIVE score, by occlusion (leave one word out).

For an example with words w_1..w_n in its utterance (and, if asked, in its history turns), the
explanation scores the example itself and n copies of it, each with one word removed, in one
batch through the runtime, and reports for every word::

    contribution(w_i) = score(example) - score(example without w_i)

A positive contribution pushes towards OFFENSIVE, a negative one towards SAFE. The scores are
the runtime's own served scores (:attr:`dialogue_safety.core.schema.Prediction.score`, i.e. the card's
calibrated score heads); nothing here re-derives them, so an explanation always explains the
number the API returns, for any number of heads.

Why occlusion: it is model-agnostic and needs only forward passes (no gradients, so it runs on
the torch-free ONNX runtime), and it answers the reviewer's question directly ("how much lower
would the score be without this word?"). Its cost is one extra sequence per explained word, run
as one length-sorted batch: about the cost of classifying a batch of n+1 items of that length
(see docs/api.md for measured latencies). Interactions between words are not captured (removing
"not" and "good" together is not the sum of removing each), which is the usual limit of
leave-one-out attributions.

Words are maximal runs of non-whitespace characters of the *raw* text, with character offsets
into the text the caller sent (``text[start:end] == word``). At most ``max_words`` words per
example are explained (utterance first, then history from the newest turn back); the rest are
counted in ``unexplained_words``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dialogue_safety.core.schema import Example, Prediction, Turn

METHOD = "occlusion"
MAX_EXPLAINED_WORDS = 127  # + the example itself = 128 sequences per explained example
_WORD = re.compile(r"\S+")


class Predictor(Protocol):
    def predict(self, examples: Sequence[Example], threshold: float | None = None) -> list[Prediction]: ...


@dataclass(frozen=True, slots=True)
class WordSpan:
    """One word of the utterance (``turn is None``) or of history turn ``turn``."""

    word: str
    start: int
    end: int
    turn: int | None = None


def word_spans(text: str, turn: int | None = None) -> list[WordSpan]:
    return [WordSpan(m.group(), m.start(), m.end(), turn) for m in _WORD.finditer(text)]


def _without(text: str, span: WordSpan) -> str:
    return text[: span.start] + " " + text[span.end :]


@dataclass(frozen=True)
class OcclusionPlan:
    """The sequences one explanation needs and how to turn their scores into contributions."""

    example: Example
    spans: tuple[WordSpan, ...]
    history: bool
    unexplained: int

    def examples(self) -> list[Example]:
        """``[example, example without spans[0], example without spans[1], ...]``."""
        out = [self.example]
        for span in self.spans:
            if span.turn is None:
                out.append(replace(self.example, utterance=_without(self.example.utterance, span)))
            else:
                turns = list(self.example.history)
                old = turns[span.turn]
                turns[span.turn] = Turn(_without(old.text, span), old.speaker)
                out.append(replace(self.example, history=tuple(turns)))
        return out

    def __len__(self) -> int:
        return 1 + len(self.spans)

    def explanation(self, scores: Sequence[float]) -> dict[str, Any]:
        """The JSON explanation from the scores of :meth:`examples` (same order)."""
        if len(scores) != len(self):
            raise ValueError(f"expected {len(self)} scores, got {len(scores)}")
        base = float(scores[0])
        contribution = {span: base - float(s) for span, s in zip(self.spans, scores[1:], strict=True)}

        def words(text: str, turn: int | None) -> list[dict[str, Any]]:
            return [
                {
                    "word": s.word,
                    "start": s.start,
                    "end": s.end,
                    "contribution": contribution.get(s),
                }
                for s in word_spans(text, turn)
            ]

        out: dict[str, Any] = {
            "method": METHOD,
            "score": base,
            "utterance": words(self.example.utterance, None),
        }
        if self.history:
            out["history"] = [words(t.text, i) for i, t in enumerate(self.example.history)]
        out["unexplained_words"] = self.unexplained
        return out


def plan(example: Example, *, history: bool = False, max_words: int = MAX_EXPLAINED_WORDS) -> OcclusionPlan:
    """Which words of ``example`` to occlude: the utterance's, then (if ``history``) the turns'
    from the newest back, at most ``max_words`` in all."""
    candidates = word_spans(example.utterance)
    total = len(candidates)
    if history:
        for i in reversed(range(len(example.history))):
            turn_words = word_spans(example.history[i].text, i)
            candidates += turn_words
            total += len(turn_words)
    chosen = tuple(candidates[:max_words])
    return OcclusionPlan(example, chosen, history, total - len(chosen))


def explain(
    classifier: Predictor,
    examples: Sequence[Example],
    *,
    history: bool = False,
    threshold: float | None = None,
    max_words: int = MAX_EXPLAINED_WORDS,
) -> list[tuple[Prediction, dict[str, Any]]]:
    """Predictions and explanations for ``examples``; all occlusions run in one ``predict`` call."""
    plans = [plan(e, history=history, max_words=max_words) for e in examples]
    flat = [x for p in plans for x in p.examples()]
    predictions = classifier.predict(flat, threshold) if flat else []
    out: list[tuple[Prediction, dict[str, Any]]] = []
    start = 0
    for p in plans:
        chunk = predictions[start : start + len(p)]
        out.append((chunk[0], p.explanation([x.score for x in chunk])))
        start += len(p)
    return out
