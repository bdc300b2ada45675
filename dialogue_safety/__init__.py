"""Context-aware dialogue safety: is the last message of a conversation offensive, given what came before it?

    import dialogue_safety

    dialogue_safety.classify("you are an idiot").label  # <Label.OFFENSIVE: 'OFFENSIVE'>
    dialogue_safety.classify("so what", history=["I lost my job today"])  # Prediction(score, label, threshold, ...)

    model = dialogue_safety.load()  # the bundled model; or load("path/to/model_dir", variant="int8")
    dialogue_safety.classify_batch(["you are a clown", dialogue_safety.Example.from_texts("ok", ["hi"])], model=model)

:func:`load` returns the torch-free :class:`~dialogue_safety.core.runtime.OnnxClassifier` of a model
directory (default: the bundled model, found as ``dialogue-safety serve`` finds it); :func:`classify`
judges one utterance after its history (oldest turn first), :func:`classify_batch` many dialogues in
one call, both on the bundled model (loaded once, on first use) unless given one. A label is the
model card's decision at its threshold unless ``threshold`` says otherwise. Importing this package
loads no model, no torch and no web framework. The HTTP service, training, export and evaluation
live in the subpackages (``dialogue-safety --help``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dialogue_safety.core.schema import Example, Label, Prediction, Turn

if TYPE_CHECKING:
    from dialogue_safety.core.runtime import OnnxClassifier

__all__ = ["Example", "Label", "Prediction", "Turn", "classify", "classify_batch", "load"]


def load(model_dir: str | Path | None = None, *, variant: str | None = None) -> OnnxClassifier:
    """The model directory ``model_dir`` (default: the bundled model) ready to predict, without torch.

    ``variant``: ``fp32``, ``optimized``, ``int8`` or ``fp16`` (default: the card's choice for this
    machine). Raises :class:`~dialogue_safety.core.runtime.ModelLoadError` for a directory that is not
    an exported model."""
    from dialogue_safety.core.model_dir import default_model_dir
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.runtime_options import runtime_options

    options = runtime_options(variant=variant)  # the runtime's defaults: built as serve and score build theirs
    return OnnxClassifier(default_model_dir() if model_dir is None else model_dir, **options)


@functools.cache
def _bundled() -> OnnxClassifier:
    return load()


def classify(
    utterance: str,
    history: Sequence[str | Turn] = (),
    model: OnnxClassifier | None = None,
    *,
    threshold: float | None = None,
) -> Prediction:
    """The prediction for ``utterance`` said after ``history`` (turns oldest first: texts or :class:`Turn`)."""
    turns = tuple(t if isinstance(t, Turn) else Turn(t) for t in history)
    [prediction] = classify_batch([Example(utterance=utterance, history=turns)], model, threshold=threshold)
    return prediction


def classify_batch(
    dialogues: Iterable[Example | str],
    model: OnnxClassifier | None = None,
    *,
    threshold: float | None = None,
) -> list[Prediction]:
    """One prediction per dialogue, in order; a plain string is an utterance without history."""
    examples = [d if isinstance(d, Example) else Example(utterance=d) for d in dialogues]
    return (model if model is not None else _bundled()).predict(examples, threshold=threshold)
