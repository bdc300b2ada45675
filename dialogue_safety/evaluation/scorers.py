"""What the robustness suites evaluate: anything that gives OFFENSIVE probabilities for examples.

The suites depend only on the small :class:`Scorer` protocol, so they run the same on the
torch-free ONNX runtime (``dialogue_safety.core.runtime.OnnxClassifier``), a training checkpoint
(``dialogue_safety.training.inference.TorchClassifier``), the TF-IDF baseline or a fake scorer in tests.
:func:`load_scorer` turns a ``MODEL`` path into a scorer; :class:`CachedScorer` batches calls
(with a progress bar) and remembers scores, because several suites score the same examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from dialogue_safety.core.model_dir import kind
from dialogue_safety.core.schema import Example, Turn


@runtime_checkable
class Scorer(Protocol):
    """OFFENSIVE probabilities for examples, and the decision threshold that goes with them."""

    @property
    def name(self) -> str: ...

    @property
    def threshold(self) -> float: ...

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray: ...


class ClassifierScorer:
    """Adapts a classifier with ``predict_proba``/``predict`` and a model ``card`` to :class:`Scorer`."""

    def __init__(self, classifier: Any, name: str | None = None) -> None:
        self.classifier = classifier
        card = getattr(classifier, "card", None)
        default = getattr(card, "model_id", None) or type(classifier).__name__
        self._name = name or str(getattr(classifier, "name", None) or default)
        threshold = getattr(classifier, "threshold", None)
        if threshold is None:
            if card is None:
                raise ValueError(f"{type(classifier).__name__} has neither a threshold nor a model card")
            threshold = card.threshold
        self._threshold = float(threshold)

    @property
    def name(self) -> str:
        return self._name

    @property
    def threshold(self) -> float:
        return self._threshold

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        probs = np.asarray(self.classifier.predict_proba(list(examples)), dtype=float)
        if probs.ndim == 2 and probs.shape[1] == 1:
            probs = probs[:, 0]
        if probs.shape != (len(examples),):
            # a multi-head probability matrix: the decision score is the prediction's score
            probs = np.array([p.score for p in self.classifier.predict(list(examples))], dtype=float)
        return probs


def model_kind(path: str | Path) -> str:
    """``"onnx"`` for an exported model directory, ``"checkpoint"`` for a training checkpoint."""
    return kind(path)


def load_classifier(path: str | Path) -> Any:
    """The classifier of an exported model directory (ONNX runtime) or a training checkpoint (torch)."""
    if model_kind(path) == "onnx":
        from dialogue_safety.core.runtime import OnnxClassifier

        return OnnxClassifier(path)
    from dialogue_safety.training.inference import TorchClassifier

    return TorchClassifier(path)


def load_scorer(path: str | Path) -> Scorer:
    """The scorer for an exported model directory (ONNX runtime) or a training checkpoint (torch)."""
    return ClassifierScorer(load_classifier(path))


def card_training_curve(path: str | Path) -> dict[str, Any] | None:
    """The validation curve of a model's training run (``training.curve`` of its card), or None."""
    from dialogue_safety.core.model_card import ModelCard

    try:
        curve = ModelCard.load(path).training.get("curve")
    except FileNotFoundError:
        return None
    return curve if isinstance(curve, dict) and curve.get("valid") else None


def card_training_sources(path: str | Path) -> list[str] | None:
    """The sources a model was trained on (``training.sources`` of its card), or None if unrecorded."""
    from dialogue_safety.core.model_card import ModelCard

    try:
        card = ModelCard.load(path)
    except FileNotFoundError:
        return None
    sources = card.training.get("sources")
    if not sources:
        return None
    if isinstance(sources, str):
        return [sources]
    return [str(s) for s in sources]


def _key(example: Example) -> tuple[str, tuple[tuple[str, str | None], ...]]:
    return example.utterance, tuple((t.text, t.speaker) for t in example.history)


def plain(example: Example) -> Example:
    """The bare :class:`Example` (utterance and history) of a possibly labelled example."""
    return Example(utterance=example.utterance, history=tuple(Turn(t.text, t.speaker) for t in example.history))


class CachedScorer:
    """Scores in batches with a progress bar and remembers every score it has computed."""

    def __init__(self, scorer: Scorer, batch_size: int = 256, progress: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.scorer = scorer
        self.batch_size = batch_size
        self.progress = progress
        self._cache: dict[tuple[str, tuple[tuple[str, str | None], ...]], float] = {}

    @property
    def name(self) -> str:
        return self.scorer.name

    @property
    def threshold(self) -> float:
        return float(self.scorer.threshold)

    def predict_proba(self, examples: Sequence[Example], desc: str | None = None) -> np.ndarray:
        keys = [_key(e) for e in examples]
        todo: dict[tuple[str, tuple[tuple[str, str | None], ...]], Example] = {}
        for k, e in zip(keys, examples, strict=True):
            if k not in self._cache and k not in todo:
                todo[k] = plain(e)
        pending = list(todo.items())
        starts = range(0, len(pending), self.batch_size)
        bar = tqdm(
            starts,
            desc=f"{self.name}: {desc}" if desc else self.name,
            unit="batch",
            disable=not self.progress or len(starts) < 2,
            leave=False,
        )
        for start in bar:
            chunk = pending[start : start + self.batch_size]
            probs = np.asarray(self.scorer.predict_proba([e for _, e in chunk]), dtype=float).reshape(-1)
            if probs.shape != (len(chunk),):
                raise ValueError(
                    f"scorer {self.name!r} returned {probs.shape[0]} probabilities for {len(chunk)} examples"
                )
            if not np.all(np.isfinite(probs)):
                raise ValueError(f"scorer {self.name!r} returned non-finite probabilities")
            self._cache.update(zip((k for k, _ in chunk), probs.tolist(), strict=True))
        return np.array([self._cache[k] for k in keys], dtype=float)


def score(scorer: Scorer, examples: Sequence[Example], desc: str | None = None) -> np.ndarray:
    """``scorer.predict_proba(examples)`` as a float array, labelling the progress bar when it has one."""
    if not examples:
        return np.zeros(0)
    if isinstance(scorer, CachedScorer):
        return scorer.predict_proba(examples, desc=desc)
    probs = np.asarray(scorer.predict_proba([plain(e) for e in examples]), dtype=float).reshape(-1)
    if probs.shape != (len(examples),):
        raise ValueError(f"scorer {scorer.name!r} returned {probs.shape[0]} probabilities for {len(examples)} examples")
    return probs
