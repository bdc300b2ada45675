"""Which language a text is in, and whether the model reads it: the one language check.

The model is English-only (its card says so): a French insult scores as confidently SAFE as an
English greeting. :func:`detect` says so in the answer (``"language": "fr"``,
``"language_supported": false``); the verdict is still returned.

The detector is py3langid (a maintained fork of langid.py: naive Bayes over byte n-grams, 97
languages, its model shipped inside the package, numpy only). Its raw top language is wrong for a
quarter of short English texts (``"it"`` for a two-word tweet), so a language other than English
is only reported when its normalised probability reaches :data:`MIN_CONFIDENCE`; a text whose top
guess is another language below that is ``"und"`` (undetermined) and counts as supported. Only the
first :data:`SAMPLE_CHARS` characters are read (the cost grows with the length). Measured by
``python -m lab.bench language`` (:mod:`lab.bench.language`; docs/api.md, "Language"):
at 0.8, 0.23 % of 1,713 short English test utterances are said "not English", and 91.8 % of 400
French and Italian texts (64.8 % of their first 5 words).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

SUPPORTED = frozenset({"en"})  # the languages the model was trained on
MIN_CONFIDENCE = 0.8  # normalised probability a language other than English needs to be reported
SAMPLE_CHARS = 600  # characters of the text the check reads
UNDETERMINED = "und"  # ISO 639-2: no language could be told with confidence

_lock = threading.Lock()
_identifier: Any = None


@dataclass(frozen=True, slots=True)
class Language:
    code: str  # ISO 639-1 code, or "und"
    confidence: float  # normalised probability of the detector's top language
    supported: bool  # False: confidently a language the model does not read


class LanguageCheckUnavailable(RuntimeError):
    """py3langid is not installed (it comes with the serve extra)."""


def _load() -> Any:
    global _identifier
    with _lock:
        if _identifier is None:
            try:
                from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier
            except ImportError as exc:
                raise LanguageCheckUnavailable(
                    f"the language check needs py3langid ({exc}): pip install 'dialogue-safety[serve]'"
                ) from exc
            _identifier = LanguageIdentifier.from_model_file(MODEL_DIR / MODEL_FILE, norm_probs=True)
    return _identifier


def load() -> None:
    """Load the detector now (at start-up, not on the first request); raises :class:`LanguageCheckUnavailable`."""
    _load()


def top_guess(text: str) -> tuple[str, float]:
    """The detector's top language for ``text`` (its first :data:`SAMPLE_CHARS` characters) and its
    normalised probability, before any rule."""
    code, prob = _load().classify(text[:SAMPLE_CHARS])
    return str(code), float(prob)


def detect(text: str) -> Language:
    """The language of ``text`` (its first :data:`SAMPLE_CHARS` characters)."""
    code, prob = top_guess(text)
    if code in SUPPORTED:
        return Language(code, prob, True)
    if prob < MIN_CONFIDENCE:
        return Language(UNDETERMINED, prob, True)
    return Language(code, prob, False)
