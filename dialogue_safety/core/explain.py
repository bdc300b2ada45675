"""Word-level explanations of the served OFFENSIVE score: Shapley values over words (default) or
leave-one-word-out occlusion.

Both methods treat the words of the utterance (and, if asked, of the history turns) as the
players of a game whose value is the runtime's own served score
(:attr:`dialogue_safety.core.schema.Prediction.score`, i.e. the card's calibrated score heads,
through :meth:`Predictor.predict`): ``v(S)`` is the score of the example with every explained word
outside ``S`` removed. Nothing here re-derives scores, so an explanation always explains the
number the API returns, and any change to how the runtime reads a message (windows, heads,
decomposed passes) applies to explanations too. Every sequence an explanation needs runs in one
``predict`` call (the runtime cuts it into length-sorted batches under its token budget).

``"shapley"`` (the default): Shapley values estimated by KernelSHAP (Lundberg & Lee, 2017): the
weighted least-squares problem over coalitions whose solution is the Shapley value, constrained so
that the contributions add up exactly to ``v(all words) - v(no explained word)`` (efficiency;
``baseline`` in the explanation is that second score). Up to 6 words every coalition is scored
and the values are exact. Beyond, the objective is estimated by strata: every single word alone
(short sequences, so cheap) with its exact kernel weight, plus ``budget`` coalitions of the other
sizes drawn from the Shapley kernel, each with its complement (Covert & Lee, 2021), seeded by the
text (the same request gets the same answer); the fit is shrunk towards each word's score alone,
scaled to the total (:func:`singleton_prior`), where the few coalitions cannot decide (how much
that helps, against estimates from many more coalitions: lab/notes/benchmarks.md, "Explanations";
tests/test_explain.py holds it on a synthetic game). Shapley
values see redundant evidence: in "you are a stupid idiot" either insult alone keeps the score
high, so leaving one out barely moves it, but both get a large positive share. The cost is
``n`` sequences of one word plus ``budget`` sequences of on average half the words, instead of
``n`` sequences of nearly all of them: linear in length, not quadratic (``python -m lab.bench
explain``). Sampled values are estimates; the efficiency constraint holds exactly.

``"occlusion"``: ``contribution(w_i) = v(all) - v(all but w_i)``. Exact and cheaper for a few
words; blind to redundancy (two insults each get about 0) and quadratic in length.

Words are maximal runs of non-whitespace characters of the *raw* text, with character offsets
into the text the caller sent (``text[start:end] == word``). At most ``max_words`` words per
example are explained (utterance first, then history from the newest turn back); the rest stay
in every sequence and are counted in ``unexplained_words``.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import combinations
from typing import Any, Literal, Protocol

import numpy as np

from dialogue_safety.core.schema import Example, Prediction, Turn

Method = Literal["shapley", "occlusion"]
METHODS: tuple[Method, ...] = ("shapley", "occlusion")
DEFAULT_METHOD: Method = "shapley"
METHOD = DEFAULT_METHOD  # the method of a plain explain request
MAX_EXPLAINED_WORDS = 127  # occlusion: + the example itself = 128 sequences per explained example
SHAPLEY_MAX_WORDS = 256  # shapley: players per example (the cost is the budget, not the words)
SHAPLEY_BUDGET = 16  # coalitions drawn per example beyond the singletons, when not every coalition fits
EXACT_COALITIONS = 62  # every coalition is scored (exact Shapley values) up to this many (6 words)
_RIDGE = 0.1  # a sampled game's shrinkage towards singleton_prior (relative to the mean weight)
# (0.2 shrinks more but lets a context-dependent word's score alone dominate: see tests/test_explain.py)
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


def _keep_only(text: str, spans: Sequence[WordSpan], removed: set[WordSpan]) -> str:
    """``text`` with the words of ``removed`` (among ``spans``, in text order) blanked out."""
    out, pos = [], 0
    for span in spans:
        if span in removed:
            out.append(text[pos : span.start])
            out.append(" ")
            pos = span.end
    out.append(text[pos:])
    return "".join(out)


def _masked(example: Example, spans: Sequence[WordSpan], removed: set[WordSpan]) -> Example:
    """``example`` with the words ``removed`` taken out of its utterance and history turns."""
    by_turn: dict[int | None, list[WordSpan]] = {}
    for span in spans:
        by_turn.setdefault(span.turn, []).append(span)
    utterance = example.utterance
    if removed & set(by_turn.get(None, ())):
        utterance = _keep_only(utterance, by_turn[None], removed)
    turns = list(example.history)
    for i, turn in enumerate(turns):
        words = by_turn.get(i, [])
        if removed & set(words):
            turns[i] = Turn(_keep_only(turn.text, words, removed), turn.speaker)
    return replace(example, utterance=utterance, history=tuple(turns))


@dataclass(frozen=True)
class _Plan:
    example: Example
    spans: tuple[WordSpan, ...]
    history: bool
    unexplained: int

    method: Method = field(init=False, default=DEFAULT_METHOD)

    def examples(self) -> list[Example]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.examples())

    def contributions(self, scores: Sequence[float]) -> dict[WordSpan, float]:
        raise NotImplementedError

    def explanation(self, scores: Sequence[float]) -> dict[str, Any]:
        """The JSON explanation from the scores of :meth:`examples` (same order; the first is the example's)."""
        if len(scores) != len(self):
            raise ValueError(f"expected {len(self)} scores, got {len(scores)}")
        contribution = self.contributions([float(s) for s in scores])

        def words(text: str, turn: int | None) -> list[dict[str, Any]]:
            return [
                {"word": s.word, "start": s.start, "end": s.end, "contribution": contribution.get(s)}
                for s in word_spans(text, turn)
            ]

        out: dict[str, Any] = {"method": self.method, "score": float(scores[0])}
        out.update(self.extra(scores))
        out["utterance"] = words(self.example.utterance, None)
        if self.history:
            out["history"] = [words(t.text, i) for i, t in enumerate(self.example.history)]
        out["unexplained_words"] = self.unexplained
        return out

    def extra(self, scores: Sequence[float]) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class OcclusionPlan(_Plan):
    """Leave one word out: ``[example, example without spans[0], example without spans[1], ...]``."""

    method: Method = field(init=False, default="occlusion")

    def examples(self) -> list[Example]:
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

    def contributions(self, scores: Sequence[float]) -> dict[WordSpan, float]:
        base = scores[0]
        return {span: base - s for span, s in zip(self.spans, scores[1:], strict=True)}


def coalitions(n: int, budget: int, seed: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """KernelSHAP's coalitions of ``n`` players: ``(masks [m, n] bool, weights [m], exact)``.

    Every proper non-empty coalition with its Shapley-kernel weight when ``2**n - 2 <= budget``
    (``exact``: the solution is the Shapley value); else ``budget`` coalitions drawn in
    complementary pairs, sizes from the kernel ``p(k) ~ (n-1) / (k (n-k))``, each drawn
    coalition weighted 1 (duplicates add up)."""
    if n < 2:
        return np.zeros((0, n), dtype=bool), np.zeros(0), True
    if 2**n - 2 <= max(budget, EXACT_COALITIONS):
        rows, weights = [], []
        for k in range(1, n):
            w = (n - 1) / (math.comb(n, k) * k * (n - k))
            for members in combinations(range(n), k):
                row = np.zeros(n, dtype=bool)
                row[list(members)] = True
                rows.append(row)
                weights.append(w)
        return np.array(rows), np.array(weights), True
    # every singleton (short sequences: cheap) with its exact kernel mass, then ``budget`` draws
    # from the other sizes in proportion to their kernel mass, a drawn coalition with its complement
    # (unless that is a singleton, already there): a stratified estimate of the same objective
    rng = np.random.default_rng(seed)
    mass = {k: (n - 1) / (k * (n - k)) for k in range(1, n)}
    masks: list[np.ndarray] = list(np.eye(n, dtype=bool))
    counts: list[float] = [mass[1] / n] * n
    sizes = np.arange(2, n)
    p = np.array([mass[int(k)] for k in sizes])
    rest = float(p.sum())
    p /= rest
    drawn: list[np.ndarray] = []
    while len(drawn) < budget:
        k = int(rng.choice(sizes, p=p))
        row = np.zeros(n, dtype=bool)
        row[rng.choice(n, size=k, replace=False)] = True
        drawn.append(row)
        if n - k >= 2 and len(drawn) < budget:
            drawn.append(~row)
    found: dict[bytes, int] = {}
    each = rest / len(drawn)
    for mask in drawn:
        key = np.packbits(mask).tobytes()
        if key in found:
            counts[found[key]] += each
        else:
            found[key] = len(masks)
            masks.append(mask)
            counts.append(each)
    return np.array(masks), np.array(counts), False


def kernel_shap(
    masks: np.ndarray,
    weights: np.ndarray,
    values: np.ndarray,
    empty: float,
    full: float,
    ridge: float = 0.0,
    prior: np.ndarray | None = None,
) -> np.ndarray:
    """The weighted least-squares fit ``v(S) - empty ~ sum_{i in S} phi_i`` constrained to
    ``sum(phi) = full - empty``: exact Shapley values for the exact coalition set (``ridge`` 0).

    A sampled set gets a ridge (relative to the weights) that pulls ``phi`` towards ``prior``
    (default 0) where the samples say little: with few coalitions for many words, the system is
    underdetermined, and the shrinkage decides what the data cannot."""
    n = masks.shape[1]
    total = full - empty
    if n == 1:
        return np.array([total])
    base = np.zeros(n) if prior is None else np.asarray(prior, dtype=np.float64)
    z = masks.astype(np.float64)
    w = np.asarray(weights, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64) - empty - z @ base
    a = z.T @ (z * w[:, None])
    if ridge:
        a += np.eye(n) * (ridge * max(1.0, float(np.trace(a)) / n))
    b = z.T @ (w * y)
    a_inv_b = np.linalg.solve(a, b)
    a_inv_1 = np.linalg.solve(a, np.ones(n))
    lam = (a_inv_b.sum() - (total - base.sum())) / a_inv_1.sum()
    return np.asarray(base + a_inv_b - lam * a_inv_1)


def singleton_prior(singles: np.ndarray, total: float) -> np.ndarray:
    """Each word's score alone (minus the empty score), scaled to add up to ``total``: the shrinkage
    target of a sampled game (the Shapley values of an additive game; for redundant words it
    already splits the credit)."""
    s = float(singles.sum())
    if abs(s) < 1e-9:
        return np.full(len(singles), total / len(singles))
    return np.asarray(singles * (total / s))


def _seed(example: Example, spans: Sequence[WordSpan]) -> int:
    text = "\x1f".join([example.utterance, *(t.text for t in example.history), str(len(spans))])
    return zlib.crc32(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class ShapleyPlan(_Plan):
    """``[example, example without every explained word, coalition 1, ..., coalition m]``."""

    budget: int = SHAPLEY_BUDGET
    method: Method = field(init=False, default="shapley")

    @cached_property
    def _coalitions(self) -> tuple[np.ndarray, np.ndarray, bool]:
        return coalitions(len(self.spans), self.budget, _seed(self.example, self.spans))

    def examples(self) -> list[Example]:
        if not self.spans:
            return [self.example]
        masks, _, _ = self._coalitions
        every = set(self.spans)
        out = [self.example, _masked(self.example, self.spans, every)]
        for mask in masks:
            kept = {s for s, keep in zip(self.spans, mask, strict=True) if keep}
            out.append(_masked(self.example, self.spans, every - kept))
        return out

    def __len__(self) -> int:
        return 1 if not self.spans else 2 + len(self._coalitions[0])

    def contributions(self, scores: Sequence[float]) -> dict[WordSpan, float]:
        if not self.spans:
            return {}
        masks, weights, exact = self._coalitions
        values = np.array(scores[2:])
        if exact:
            phi = kernel_shap(masks, weights, values, scores[1], scores[0])
        else:  # the first n coalitions are the singletons (see coalitions())
            prior = singleton_prior(values[: len(self.spans)] - scores[1], scores[0] - scores[1])
            phi = kernel_shap(masks, weights, values, scores[1], scores[0], _RIDGE, prior)
        return {span: float(v) for span, v in zip(self.spans, phi, strict=True)}

    def extra(self, scores: Sequence[float]) -> dict[str, Any]:
        exact = self._coalitions[2]
        return {
            "baseline": float(scores[1]) if self.spans else float(scores[0]),
            "exact": bool(exact),
            "coalitions": 0 if not self.spans else len(self) - 2,
        }


Plan = OcclusionPlan | ShapleyPlan


def plan(
    example: Example,
    *,
    history: bool = False,
    max_words: int | None = None,
    method: Method = DEFAULT_METHOD,
    budget: int = SHAPLEY_BUDGET,
) -> Plan:
    """The sequences one explanation needs: which words are players (the utterance's, then, if
    ``history``, the turns' from the newest back, at most ``max_words``), and for ``"shapley"``
    which coalitions are scored (at most ``budget`` + 2 sequences)."""
    if method not in METHODS:
        raise ValueError(f"unknown explanation method {method!r}; expected one of {METHODS}")
    if max_words is None:
        max_words = SHAPLEY_MAX_WORDS if method == "shapley" else MAX_EXPLAINED_WORDS
    candidates = word_spans(example.utterance)
    total = len(candidates)
    if history:
        for i in reversed(range(len(example.history))):
            turn_words = word_spans(example.history[i].text, i)
            candidates += turn_words
            total += len(turn_words)
    chosen = tuple(candidates[: max(0, max_words)])
    if method == "occlusion":
        return OcclusionPlan(example, chosen, history, total - len(chosen))
    return ShapleyPlan(example, chosen, history, total - len(chosen), budget=max(2, budget))


def plan_within(example: Example, sequences: int, *, history: bool = False, method: Method = DEFAULT_METHOD) -> Plan:
    """:func:`plan` needing at most ``sequences`` sequences (the service: what one explanation may cost): occlusion
    explains fewer words; Shapley draws fewer coalitions and, if still needed, explains fewer words."""
    if method == "occlusion":
        return plan(example, history=history, max_words=min(MAX_EXPLAINED_WORDS, sequences - 1), method=method)
    budget = max(2, min(SHAPLEY_BUDGET, sequences // 4))
    max_words = max(0, min(SHAPLEY_MAX_WORDS, sequences - 2 - budget))
    out = plan(example, history=history, max_words=max_words, method=method, budget=budget)
    while len(out) > sequences and out.spans:  # an exact game of a few words needs 2**n sequences
        out = plan(example, history=history, max_words=len(out.spans) - 1, method=method, budget=budget)
    return out


def explain(
    classifier: Predictor,
    examples: Sequence[Example],
    *,
    history: bool = False,
    threshold: float | None = None,
    max_words: int | None = None,
    method: Method = DEFAULT_METHOD,
    budget: int = SHAPLEY_BUDGET,
) -> list[tuple[Prediction, dict[str, Any]]]:
    """Predictions and explanations for ``examples``; every sequence of every explanation runs in
    one ``predict`` call."""
    plans = [plan(e, history=history, max_words=max_words, method=method, budget=budget) for e in examples]
    sequences = [p.examples() for p in plans]
    flat = [x for seq in sequences for x in seq]
    predictions = classifier.predict(flat, threshold) if flat else []
    out: list[tuple[Prediction, dict[str, Any]]] = []
    start = 0
    for p, seq in zip(plans, sequences, strict=True):
        chunk = predictions[start : start + len(seq)]
        out.append((chunk[0], p.explanation([x.score for x in chunk])))
        start += len(seq)
    return out
