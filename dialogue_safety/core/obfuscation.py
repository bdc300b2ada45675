"""Undoing the common disguises of abusive words, so that the model reads the words themselves.

``1d10t``, ``i d i o t``, ``ｉｄｉｏｔ``, ``🇮🇩🇮🇴🇹``, ``іdіоt`` (Cyrillic і and о), ``id\u200biot`` and
``i̵d̵i̵o̵t̵`` are all "idiot" to a reader and were different token sequences to the model.
:func:`deobfuscate` is part of the encoding contract (``EncodingConfig.normalise_obfuscation``,
applied by :func:`dialogue_safety.core.encoding.normalise_text`), so training, serving,
explanations and corpus scoring read the same text. Each rule is narrow so that ordinary text is
left alone:

* **invisible characters** (zero-width spaces and joiners, word joiner, BOM, soft hyphen,
  variation selectors) are removed;
* **letter emoji**: regional-indicator letters in runs other than a pair (a pair is a flag),
  negative circled and negative squared letters become ASCII letters (circled, squared,
  full-width and mathematical letters are folded by NFKC in the encoder);
* **combining marks** on Latin letters (accents, strike-through, "Zalgo") are removed; the
  uncased tokenizer drops accents anyway, and other scripts' marks are kept;
* **look-alike letters**: Cyrillic and Greek letters that look like Latin ones become Latin
  inside a word that also has a Latin letter (a word wholly in Cyrillic or Greek is left alone);
* **digit and symbol swaps** (0 o, 1 i, 3 e, 4 a, 5 s, 7 t, @ a, $ s, ! i) in a word where such a
  character stands between two letters (``sh1t``, ``n1gg3r``, ``a$$hole``) or that is letters and
  at least two swapped characters only, after a first letter (``h473$``), never in numbers or in
  words with one swap at an end or a leading digit (``covid19``, ``mp3``, ``3rd``, ``10am``);
* **spaced letters**: three or more single letters separated by one space, dot, dash, underscore
  or asterisk are joined (``f.u.c.k``, ``i d i o t``);
* **stretched letters**: a letter repeated three times or more is kept twice (``stuuupid`` becomes
  ``stuupid``, ``soooo good`` becomes ``soo good``).
"""

from __future__ import annotations

import re
import unicodedata

_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff\ufe00-\ufe0f]")
_REGIONAL_RUN = re.compile("[\U0001f1e6-\U0001f1ff]+")
_NEGATIVE_LETTERS = {
    **{0x1F150 + i: chr(ord("a") + i) for i in range(26)},  # negative circled
    **{0x1F170 + i: chr(ord("a") + i) for i in range(26)},  # negative squared
}
_NEGATIVE_LETTER = re.compile("[\U0001f150-\U0001f169\U0001f170-\U0001f189]")
_CONFUSABLE = str.maketrans(
    {
        # Cyrillic
        "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
        "т": "t", "у": "y", "х": "x", "і": "i", "ј": "j", "ѕ": "s", "ԁ": "d", "ɡ": "g", "ո": "n",
        "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
        "Т": "T", "Х": "X", "І": "I", "Ј": "J", "Ѕ": "S",
        # Greek
        "α": "a", "ο": "o", "ν": "v", "ι": "i", "κ": "k", "τ": "t", "υ": "u", "ρ": "p", "χ": "x",
        "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
        "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    }
)  # fmt: skip
_CONFUSABLE_CHARS = frozenset(chr(c) for c in _CONFUSABLE)
# combining marks (diacritics, overlays, "Zalgo") on a Latin letter; other scripts' marks are letters' parts
_MARKS = "[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]"
_MARK = re.compile(_MARKS)  # found by a scan that skips to the marks in C
_MARKS_ON_LATIN = re.compile(f"([A-Za-z]){_MARKS}+")
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i"})
_LEET_BETWEEN_LETTERS = re.compile(r"[a-z][013457@$!]+[a-z]", re.IGNORECASE)
# a word that starts with a letter and is letters and two or more swapped characters only ("h473$", "a55");
# "!" is left out here because it ends ordinary words ("wow!!"); one swap alone, or a leading digit, is too
# often a real token ("mp3", "3rd", "10am")
_LEET_WORD = re.compile(r"(?=(?:.*[013457@$]){2})[a-z][a-z013457@$]+", re.IGNORECASE)
# a word (a run of non-whitespace) can change only if it holds a look-alike letter or a swapped character:
# those are found by one scan of the text (a pattern that starts with a character class is skipped through
# in C), and only their words are read in Python
_CHANGEABLE = re.compile("[" + re.escape("".join(sorted({*_CONFUSABLE_CHARS, *"013457@$!"}))) + "]")
_SPACE = re.compile(r"\s")
_SPACED = re.compile(r"(?<![^\W\d_])(?:[^\W\d_][ .\-_*]){2,}[^\W\d_](?![^\W\d_])")
_SPACER = re.compile(r"[ .\-_*]")
# what every spaced run holds from its first separator on (a separator, a letter, a separator, a letter that
# no letter follows): rare in ordinary text, and found by a scan that skips to the separators in C
_SPACED_HINT = re.compile(r"[ .\-_*][^\W\d_][ .\-_*][^\W\d_](?![^\W\d_])")
_LETTER = re.compile(r"[^\W\d_]")
_STRETCHED = re.compile(r"([^\W\d_])\1{2,}")
# stretched letters are looked up letter by letter (substring search) in a text of at most this many distinct
# letters, and replaced letter by letter when at most this many are stretched; else _STRETCHED scans the text
_STRETCH_LOOKUPS = 64
_STRETCH_REPLACES = 4


def _regional(match: re.Match[str]) -> str:
    run = match.group(0)
    if len(run) == 2:
        return run  # a flag
    return "".join(chr(ord("a") + ord(c) - 0x1F1E6) for c in run)


def _word(word: str) -> str:
    if not word.isascii() and not _CONFUSABLE_CHARS.isdisjoint(word) and any("a" <= c.lower() <= "z" for c in word):
        word = word.translate(_CONFUSABLE)
    if _LEET_BETWEEN_LETTERS.search(word) or _LEET_WORD.fullmatch(word):
        word = word.translate(_LEET)
    return word


def _word_end(text: str, at: int) -> int:
    """Where the word (the run of non-whitespace) that holds ``text[at]`` ends."""
    space = _SPACE.search(text, at)
    return len(text) if space is None else space.start()


def _words(text: str) -> str:
    """The look-alike and swap rules, word by word: every word that holds a character they change is
    rewritten by :func:`_word`; the others (most words) are copied without being read in Python."""
    found = _CHANGEABLE.search(text)
    if found is None:
        return text
    size, backwards = len(text), text[::-1]  # a word's start is its reversed copy's end: one forward match finds it
    parts: list[str] = []
    done = 0
    while found is not None:
        at = found.start()
        start = size - _word_end(backwards, size - 1 - at)
        end = _word_end(text, at)
        parts.append(text[done:start])
        parts.append(_word(text[start:end]))
        done = end
        found = _CHANGEABLE.search(text, end)
    parts.append(text[done:])
    return "".join(parts)


def _unstretched(text: str) -> str:
    """Every run of three or more of one letter kept twice, as the substitution of ``_STRETCHED`` gives it.
    When few letters are stretched, they are found and replaced by substring search: each replacement of three
    by two shortens every run of that letter by a third, stops at two, and never touches another letter."""
    letters = [c for c in set(text) if _LETTER.match(c)]
    stretched = [c for c in letters if c * 3 in text] if len(letters) <= _STRETCH_LOOKUPS else letters
    if len(stretched) > _STRETCH_REPLACES:
        return _STRETCHED.sub(r"\1\1", text)
    for letter in stretched:
        triple = letter * 3
        while triple in text:
            text = text.replace(triple, letter * 2)
    return text


def deobfuscate(text: str) -> str:
    """The text with the disguises in the module docstring undone (a fixed function of the text, read in
    time linear in its length: every pattern is a single scan, and the ones that cannot match are skipped)."""
    if not text.isascii():
        text = _INVISIBLE.sub("", text)
        text = _REGIONAL_RUN.sub(_regional, text)
        if _NEGATIVE_LETTER.search(text):
            text = text.translate(_NEGATIVE_LETTERS)
        decomposed = unicodedata.normalize("NFKD", text)
        if _MARK.search(decomposed) and _MARKS_ON_LATIN.search(decomposed):
            text = unicodedata.normalize("NFC", _MARKS_ON_LATIN.sub(r"\1", decomposed))
    text = _words(text)
    if _SPACED_HINT.search(text):
        text = _SPACED.sub(lambda m: _SPACER.sub("", m.group(0)), text)
    return _unstretched(text)
