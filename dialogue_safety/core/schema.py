"""The one example type every dataset is read into and every caller predicts on.

A dialogue example is an ordered history of turns (oldest first) plus the utterance to
classify. A labelled example adds the gold label, the source/task it came from, the official
split and round, and free metadata (type/target of hate, original vs perturbation,
functionality, ...).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dialogue_safety.core.errors import InvalidInput


class Label(StrEnum):
    SAFE = "SAFE"
    OFFENSIVE = "OFFENSIVE"

    @property
    def is_positive(self) -> bool:
        return self is Label.OFFENSIVE

    @classmethod
    def from_bool(cls, offensive: bool) -> Label:
        return cls.OFFENSIVE if offensive else cls.SAFE


class LabelFamily(StrEnum):
    """What a source means by "positive": the sources do not all mean the same thing."""

    OFFENSIVE = "offensive"  # an offensive utterance (BBF, Wikipedia Toxic Comments, ConvAbuse, BAD)
    HATEFUL = "hateful"  # hate against a protected group (DynaHate, HatemojiBuild, HateCheck)
    UNSAFE_IN_CONTEXT = "unsafe_in_context"  # a reply unsafe given its context (DiaSafety)


# LabelledExample.metadata flag: the label is about the reply in its context (it does not endorse
# the history) and says nothing of the utterance alone (counter-speech that may itself be rude)
UTTERANCE_UNLABELLED = "utterance_unlabelled"


# LabelledExample.metadata keys of attributes some sources label on every row (a bool each): a
# threat or call for violence, and a request for harmful help. They teach heads of their own
# (training/harmonise.py), reported as categories beside the served score.
VIOLENCE = "violence"
UNSAFE_REQUEST = "unsafe_request"


class Split(StrEnum):
    TRAIN = "train"
    VALID = "valid"
    TEST = "test"


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of dialogue history; ``speaker`` is free text such as ``user``, ``bot``, ``P1``."""

    text: str
    speaker: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Example:
    """The utterance to classify and the turns that came before it (oldest first)."""

    utterance: str
    history: tuple[Turn, ...] = ()

    @classmethod
    def from_texts(cls, utterance: str, history: tuple[str, ...] | list[str] = ()) -> Example:
        return cls(utterance=utterance, history=tuple(Turn(t) for t in history))

    def without_history(self) -> Example:
        return Example(utterance=self.utterance)


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelledExample(Example):
    """An example with its gold label and where it came from.

    ``source`` names the dataset (``diasafety``, ``bbf_single_turn``...), ``task`` the finer
    training task inside it (e.g. ``bbf_single_turn/adversarial``; defaults to the source),
    ``round`` the adversarial round as a string (``"1"``, ``"2a"``, ``"R5"``) or None.
    """

    label: Label
    source: str
    split: Split
    family: LabelFamily = LabelFamily.OFFENSIVE
    task: str = ""
    round: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def task_name(self) -> str:
        return self.task or self.source

    def as_example(self) -> Example:
        return Example(utterance=self.utterance, history=self.history)


@dataclass(frozen=True, slots=True)
class Reading:
    """What the model reads of one example: ``windows`` over its utterance (in the row with the
    most), how many the whole utterance needs (``windows_needed`` > ``windows``: cut by the cap; a
    lower bound then), the characters of the utterance past the last window read, and the
    history turns not read at all (the token budget, ``max_history_turns`` or the context mode
    left no room for them); with the language check on
    (:mod:`dialogue_safety.core.language`), the utterance's language."""

    windows: int = 1
    windows_needed: int = 1
    utterance_chars_unread: int = 0
    history_turns_dropped: int = 0
    language: str | None = None  # the utterance's language (None: not checked; "und": undetermined)
    language_supported: bool | None = True  # False: not a language the model reads; None: "und", cannot tell

    @property
    def truncated(self) -> bool:
        return self.utterance_chars_unread > 0 or self.history_turns_dropped > 0


@dataclass(frozen=True, slots=True)
class Prediction:
    """What the classifier says about one example.

    ``score`` is the calibrated probability that the utterance is OFFENSIVE; ``label`` is the
    decision at ``threshold``; ``categories`` maps each head (label family) to its calibrated
    probability when the model has more than one head; ``read`` says what the model read of the
    example (windows over a long utterance, what a cap or the history budget left out); ``policy``
    names the operator's rule that decided or changed the label (:mod:`dialogue_safety.core.policy`).
    """

    score: float
    label: Label
    threshold: float
    categories: Mapping[str, float] = field(default_factory=dict)
    read: Reading = field(default_factory=Reading)
    policy: str | None = None

    def reading(self) -> dict[str, Any]:
        """What the answer says was read: ``windows``, and ``truncated`` when something was left out."""
        out: dict[str, Any] = {"windows": self.read.windows}
        if self.read.language is not None:
            out["language"] = self.read.language
            out["language_supported"] = self.read.language_supported
        if self.read.truncated:
            out["truncated"] = {
                "utterance_chars_unread": self.read.utterance_chars_unread,
                "history_turns_dropped": self.read.history_turns_dropped,
            }
        return out


THRESHOLD_RANGE = (0.0, 1.0)  # a decision threshold, wherever one is given (requests, settings, the Python API)


def is_threshold(value: object) -> bool:
    """A number (not a bool, not a string) in :data:`THRESHOLD_RANGE`."""
    return (
        not isinstance(value, bool)
        and isinstance(value, numbers.Real)
        and THRESHOLD_RANGE[0] <= float(value) <= THRESHOLD_RANGE[1]
    )


def history_list(history: Any) -> list[Any]:
    """The turns of a history given as a sequence (oldest first); a lone text is refused (TypeError) rather than
    read as one turn per character."""
    if isinstance(history, str | bytes):
        raise TypeError("history is a list of turns, oldest first (a text alone is one turn: [text])")
    return list(history)


def check_threshold(value: object, field: str = "threshold") -> float:
    """``value`` as a decision threshold, or :class:`InvalidInput` ``invalid_threshold``: a number (not a bool,
    not a string) in :data:`THRESHOLD_RANGE`, as the service's requests are checked."""
    if not is_threshold(value):
        low, high = THRESHOLD_RANGE
        raise InvalidInput(
            f"{field} must be a number in [{low:g}, {high:g}], got {value!r}", code="invalid_threshold", field=field
        )
    return float(value)  # type: ignore[arg-type]  # a real number, checked above
