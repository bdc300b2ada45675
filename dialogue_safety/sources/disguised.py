"""Disguised copies: labelled utterances with their words disguised in ways no normaliser can undo.

The encoder undoes the unambiguous disguises (``dialogue_safety/core/obfuscation.py``: leetspeak
between letters, spaced letters, look-alikes, letter emoji, invisible characters). What is left
is ambiguous in general and learnable only from examples: a masked vowel (``f*ck``, ``id*ot``),
one swapped letter at a word's edge (``idio7``, ``@sshole``, ``$tupid``) and a word split by a
space (``stu pid``). This derived source copies OLID, ConvAbuse and DynaHate utterances (judged on
their words: no history) with such disguises, keeping label and family, so that the disguise
predicts nothing by itself: offensive and harmless utterances are copied at the same rate.

The longest word of four letters or more is always disguised, each other such word with
probability :data:`WORD_RATE`; the kind and the positions are a fixed function of the text.
Splits: copies of TRAIN rows are TRAIN, of VALID rows VALID; no TEST split (the ``obfuscation``
suite of ``dialogue-safety evaluate`` disguises test utterances its own, different ways).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from dialogue_safety.core.schema import LabelledExample, Split
from dialogue_safety.sources import convabuse, dynahate, olid
from dialogue_safety.sources.layout import SourceFiles, derived_from, load_parts
from dialogue_safety.sources.splitting import stable_fraction

SOURCE = "disguised"
SALT = "disguised-v1"
RATE = 0.25  # share of the utterances that get a disguised copy
WORD_RATE = 0.3
MIN_LETTERS = 4
KINDS = ("masked", "edge_swap", "split")
INPUTS = {"olid": olid, "convabuse": convabuse, "dynahate": dynahate}
_VOWELS = "aeiou"
_EDGE = {"a": "@", "s": "$", "e": "3", "i": "1", "o": "0", "t": "7"}


def _fraction(key: str, what: str) -> float:
    return stable_fraction(key, f"{SALT}:{what}")


def disguise_word(word: str, kind: str, key: str) -> str:
    """``word`` disguised by ``kind`` (positions chosen by a stable hash of ``key``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown disguise {kind!r} (known: {', '.join(KINDS)})")
    inner = [i for i in range(1, len(word) - 1) if word[i].lower() in _VOWELS]
    if kind == "masked" and inner:
        i = inner[int(_fraction(key, "vowel") * len(inner))]
        return word[:i] + "*" + word[i + 1 :]
    if kind == "edge_swap":
        if word[-1].lower() in _EDGE and _fraction(key, "edge") < 0.5:
            return word[:-1] + _EDGE[word[-1].lower()]
        if word[0].lower() in _EDGE:
            return _EDGE[word[0].lower()] + word[1:]
    # split, and any word the chosen disguise cannot reach
    i = 1 + int(_fraction(key, "split") * (len(word) - 1))
    return word[:i] + " " + word[i:]


def disguise(text: str) -> tuple[str, str]:
    """(the disguised text, the kind used) for an utterance with a word of four letters or more."""
    kind = KINDS[int(_fraction(text, "kind") * len(KINDS))]
    words = text.split(" ")
    long = [i for i, w in enumerate(words) if sum(c.isalpha() for c in w) >= MIN_LETTERS and w.isalpha()]
    if not long:
        return text, kind
    longest = max(long, key=lambda i: len(words[i]))
    for i in long:
        if i == longest or _fraction(f"{text}|{i}", "word") < WORD_RATE:
            words[i] = disguise_word(words[i], kind, f"{text}|{i}")
    return " ".join(words), kind


def build(rows: Sequence[LabelledExample], splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for ex in rows:
        if ex.split not in splits or ex.split is Split.TEST or ex.history or _fraction(ex.utterance, "take") >= RATE:
            continue
        text, kind = disguise(ex.utterance)
        if text != ex.utterance:
            yield replace(ex, utterance=text, source=SOURCE, task="", metadata={"kind": kind, "from": ex.source})


def find(data_dir: Path) -> SourceFiles:
    return derived_from({name: module.find(data_dir) for name, module in INPUTS.items()})


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return build(load_parts(found, {name: module.load for name, module in INPUTS.items()}, splits), splits)
