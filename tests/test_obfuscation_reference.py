"""The de-obfuscation's fast path gives exactly what the plain implementation gave, on random and hostile texts.

:func:`reference_deobfuscate` below is the first implementation of ``core/obfuscation.py``, kept verbatim: every
word read by a Python function, every pattern run over the whole text. The module now reads only the words a rule
can change and skips the patterns that cannot match; the output must not move by one character.
"""

from __future__ import annotations

import random
import re
import unicodedata

import pytest

from dialogue_safety.core import obfuscation
from dialogue_safety.core.obfuscation import deobfuscate

# -- the reference: core/obfuscation.py as it was, unchanged ------------------------------------------
_INVISIBLE = re.compile("[\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff\ufe00-\ufe0f]")
_REGIONAL_RUN = re.compile("[\U0001f1e6-\U0001f1ff]+")
_NEGATIVE_LETTERS = {
    **{0x1F150 + i: chr(ord("a") + i) for i in range(26)},  # negative circled
    **{0x1F170 + i: chr(ord("a") + i) for i in range(26)},  # negative squared
}
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
_MARKS_ON_LATIN = re.compile("([A-Za-z])[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")
_WORD = re.compile(r"\S+")
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i"})
_LEET_BETWEEN_LETTERS = re.compile(r"[a-z][013457@$!]+[a-z]", re.IGNORECASE)
# a word that starts with a letter and is letters and two or more swapped characters only ("h473$", "a55");
# "!" is left out here because it ends ordinary words ("wow!!"); one swap alone, or a leading digit, is too
# often a real token ("mp3", "3rd", "10am")
_LEET_WORD = re.compile(r"(?=(?:.*[013457@$]){2})[a-z][a-z013457@$]+", re.IGNORECASE)
_SPACED = re.compile(r"(?<![^\W\d_])(?:[^\W\d_][ .\-_*]){2,}[^\W\d_](?![^\W\d_])")
_STRETCHED = re.compile(r"([^\W\d_])\1{2,}")


def _regional(match: re.Match[str]) -> str:
    run = match.group(0)
    if len(run) == 2:
        return run  # a flag
    return "".join(chr(ord("a") + ord(c) - 0x1F1E6) for c in run)


def _word(match: re.Match[str]) -> str:
    word = match.group(0)
    if not _CONFUSABLE_CHARS.isdisjoint(word) and any("a" <= c.lower() <= "z" for c in word):
        word = word.translate(_CONFUSABLE)
    if _LEET_BETWEEN_LETTERS.search(word) or _LEET_WORD.fullmatch(word):
        word = word.translate(_LEET)
    return word


def reference_deobfuscate(text: str) -> str:
    """The implementation before the fast path (kept verbatim as the reference)."""
    if not text.isascii():
        text = _INVISIBLE.sub("", text)
        text = _REGIONAL_RUN.sub(_regional, text)
        text = "".join(_NEGATIVE_LETTERS.get(ord(c), c) for c in text)
        decomposed = unicodedata.normalize("NFKD", text)
        if _MARKS_ON_LATIN.search(decomposed):
            text = unicodedata.normalize("NFC", _MARKS_ON_LATIN.sub(r"\1", decomposed))
    text = _WORD.sub(_word, text)
    text = _SPACED.sub(lambda m: re.sub(r"[ .\-_*]", "", m.group(0)), text)
    return _STRETCHED.sub(r"\1\1", text)


# -- the texts ---------------------------------------------------------------------------------------
_PIECES = [
    *"abcdefghijklmnopqrstuvwxyzABCDEFGHIZ",
    *"0123456789@$!",  # the swapped characters, and digits that are not
    *" .-_*",  # the spacers
    *"\t\n\r\x0b\x0c\x1c\x85\xa0\u1680\u2003\u2028\u2029\u202f\u3000",  # whitespace of every kind
    *"аеокмнорстухіјѕԁɡոАВЕКМНОРСТХІЈЅ",  # Cyrillic look-alikes
    *"αονικτυρχΑΒΕΖΗΙΚΜΝΟΡΤΥΧ",  # Greek look-alikes
    *"бдживлПЖЩλπσΣωΩ",  # Cyrillic and Greek letters with no look-alike
    *"\u212a\u0130\u0131\u017f",  # Kelvin sign, dotted I, dotless i, long s: [a-z] under IGNORECASE
    *"²³½¼٣३",  # digits and numbers that are, or are not, Python's \\d
    *"\u0301\u0335\u0336\u0489\u1ab0\u1dc0\u20d2\ufe20\u094d\u093e",  # combining marks, Latin and not
    *"\u00ad\u180e\u200b\u200c\u200d\u200e\u202a\u2060\u2064\ufeff\ufe0f",  # invisible characters
    *"\U0001f1e6\U0001f1e9\U0001f1ee\U0001f1f4\U0001f1f9\U0001f1fa\U0001f1f8",  # regional indicators
    *"\U0001f150\U0001f155\U0001f170\U0001f175\U0001f189",  # negative circled and squared letters
    *"éèüñçÉØßœæ",  # precomposed accents
    *"ｉｄｏｔＡ１ⓘⓓ𝐢𝐝",  # full-width, circled, mathematical
    *"😀👍🏽❤️中文字",
    *",;:'\"?()[]{}<>/\\|#%^&+=~`",
]
_FRAGMENTS = [
    "1d10t", "sh1t", "a$$hole", "b!tch", "h473$", "a55", "wow!!", "covid19", "mp3", "3rd", "10am", "1337", "4k",
    "i d i o t", "f.u.c.k", "s-c-u-m", "a_b_c", "x*y*z", "a b", "a  b  c", "I a b c", "e.g.", "stuuuupid", "soooo",
    "aaa", "AAAA", "!!!", "...", "   ", "іdіоt", "Привет", "Γειά", "नमस्ते", "i\u0335d\u0335i\u0335o\u0335t\u0335",
    "id\u200biot", "\U0001f1ee\U0001f1e9\U0001f1ee\U0001f1f4\U0001f1f9", "\U0001f1fa\U0001f1f8",
    "\U0001f175\U0001f184\U0001f172\U0001f17a", "ｉｄｉｏｔ", "\u212aill", "\u0130d10t", "ſh1t", "²²²", "ççç",
]  # fmt: skip


def _random_text(rng: random.Random) -> str:
    size = rng.choice([1, 2, 3, 5, 8, 13, 40, 200])
    if rng.random() < 0.5:
        return "".join(rng.choice(_PIECES) for _ in range(size))
    sep = rng.choice([" ", "  ", "\n", "\u3000", "", " . "])
    return sep.join(rng.choice(_FRAGMENTS + _PIECES) for _ in range(size))


def test_the_fast_path_equals_the_reference_on_random_texts() -> None:
    rng = random.Random(55)
    changed = 0
    for _ in range(3000):
        text = _random_text(rng)
        expected = reference_deobfuscate(text)
        assert deobfuscate(text) == expected, repr(text)
        changed += expected != text
    assert changed > 1000  # the rules had work to do, not only texts they leave alone


def test_the_fast_path_equals_the_reference_for_every_character() -> None:
    """Each character of the Basic Multilingual Plane (and the letter emoji), alone, inside a word, between
    swaps, spaced and stretched: the character classes of the fast path are those of the reference."""
    chars = [chr(c) for c in [*range(0xD800), *range(0xE000, 0x10000), *range(0x1F100, 0x1F200)]]
    for i in range(0, len(chars), 64):
        chunk = chars[i : i + 64]
        text = " ".join(f"a{c}1 {c}.{c}.{c}{c}{c}" for c in chunk)
        assert deobfuscate(text) == reference_deobfuscate(text), repr(chunk)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "a",
        "1",
        "!",
        "a1",
        "a1b",
        " a1b ",
        "x" * 4000,  # one long word, no swap
        "a1" * 2000,  # one long word of swaps
        "a" + "1" * 3998 + "b",
        ("a " * 2000).strip(),  # one long spaced run
        "a." * 1999 + "bb",
        "i " * 3 + "dd " + "e-" * 5,
        " ".join("".join(chr(0x4E00 + i * 7 + j) for j in range(3)) for i in range(300)),  # > 64 distinct letters
        " ".join(chr(0x4E00 + i) * 3 for i in range(300)),  # many letters stretched, past the look-up limit
        "".join(chr(0x0410 + i % 64) for i in range(4000)),  # Cyrillic letters, look-alikes among them
        "\u0430" + "b1" * 1000 + "\u0441",  # look-alikes at both ends of a long swapped word
        "\u200b".join("idiot" * 200),
        "\U0001f1ee" * 1001,  # an odd run of regional indicators
        "e\u0301" * 2000,
        "a\u0335" * 2000 + "ж",
        "word\tword\nword\x85w0rd\u2028w0rd\u3000w0rd",
        "h473$ " * 600,
        "wow!! " * 600 + "b!tch",
    ],
)
def test_the_fast_path_equals_the_reference_on_hostile_texts(text: str) -> None:
    assert deobfuscate(text) == reference_deobfuscate(text)


def test_stretched_letters_are_replaced_letter_by_letter_or_by_the_pattern() -> None:
    """A few stretched letters are replaced by substring search, many (or a text of many letters) by the
    pattern: the same text either way (letters of the Basic Multilingual Plane, in both cases)."""
    letters = [chr(c) for c in range(0xD800) if obfuscation._LETTER.fullmatch(chr(c))]
    few, many = obfuscation._STRETCH_REPLACES, obfuscation._STRETCH_LOOKUPS
    for i in range(0, len(letters), 97):
        for n in (1, few, few + 1, many + 1):
            text = " ".join(c * 3 + "x" + c * 2 + "y" + c * 7 + c.upper() * 4 for c in letters[i : i + n])
            text = "\n".join([text, text.replace(" ", "")])
            assert obfuscation._unstretched(text) == obfuscation._STRETCHED.sub(r"\1\1", text), text
