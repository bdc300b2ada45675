"""Which language a text is in, and whether the model reads it: the one language check.

The model is English-only (its card says so): a French insult scores as confidently SAFE as an
English greeting. :func:`detect` says so in the answer (``"language": "fr"``,
``"language_supported": false``); the verdict is still returned.

The detector is py3langid (a maintained fork of langid.py: naive Bayes over byte n-grams, 97
languages, its model shipped inside the package, numpy only). Its raw top language is wrong for a
quarter of short English texts (``"it"`` for a two-word tweet), so a language other than English
is only reported when its normalised probability reaches :data:`MIN_CONFIDENCE`; a text whose top
guess is another language below that is ``"und"`` (undetermined, too short to tell), and the answer
claims nothing about support (``language_supported`` is None: JSON ``null``). A text whose letters are
mostly not Latin (Chinese, Cyrillic, Arabic...) is never said to be supported, whatever the detector's
confidence: it cannot be the English the model reads. Only the first :data:`SAMPLE_CHARS` characters are
read (the cost grows with the length). The Python API (``dialogue_safety.load``) and the service both
check by default (:data:`CHECK_BY_DEFAULT`), through ``OnnxClassifier.encode``, so they answer the same. Measured by
``python -m lab.bench language`` (:mod:`lab.bench.language`; docs/api.md, "Language"):
at 0.8, 0.23 % of 1,713 short English test utterances are said "not English", and 91.8 % of 400
French and Italian texts (64.8 % of their first 5 words).
"""

from __future__ import annotations

import threading
import unicodedata
from dataclasses import dataclass
from typing import Any

SUPPORTED = frozenset({"en"})  # the languages the model was trained on
MIN_CONFIDENCE = 0.8  # normalised probability a language other than English needs to be reported
SAMPLE_CHARS = 600  # characters of the text the check reads
UNDETERMINED = "und"  # ISO 639-2: no language could be told with confidence
CHECK_BY_DEFAULT = True  # dialogue_safety.load() and SAFETY_LANGUAGE_CHECK: answers say their language

_lock = threading.Lock()
_identifier: Any = None


@dataclass(frozen=True, slots=True)
class Language:
    code: str  # ISO 639-1 code, or "und"
    confidence: float  # normalised probability of the detector's top language
    supported: bool | None  # False: not a language the model reads; None: cannot tell ("und")


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


def latin_script(text: str) -> bool:
    """Whether most letters of ``text`` are Latin (True for a text without letters: emoji, digits)."""
    letters = [c for c in text if c.isalpha()]
    latin = sum(1 for c in letters if unicodedata.name(c, "").startswith("LATIN"))
    return 2 * latin >= len(letters)


def detect(text: str) -> Language:
    """The language of ``text`` (its first :data:`SAMPLE_CHARS` characters)."""
    sample = text[:SAMPLE_CHARS]
    code, prob = top_guess(sample)
    if not latin_script(sample):  # never the English the model reads, however short
        told = code not in SUPPORTED and prob >= MIN_CONFIDENCE
        return Language(code if told else UNDETERMINED, prob, False)
    if code in SUPPORTED:
        return Language(code, prob, True)
    if prob < MIN_CONFIDENCE:
        return Language(UNDETERMINED, prob, None)  # too short to tell: no claim of support
    return Language(code, prob, False)
