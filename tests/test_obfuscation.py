"""The de-obfuscation rules of the encoding contract: each disguise undone, ordinary text left alone."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from dialogue_safety.core.encoding import DialogueEncoder, EncodingConfig, normalise_text
from dialogue_safety.core.obfuscation import deobfuscate
from dialogue_safety.core.schema import Example


@pytest.mark.parametrize(
    ("disguised", "plain"),
    [
        ("1d10t", "idiot"),  # digits between letters
        ("you are a sh1t", "you are a shit"),
        ("a$$hole", "asshole"),
        ("b!tch", "bitch"),
        ("everyone h473$ you", "everyone hates you"),  # letters and swaps only
        ("i d i o t", "idiot"),  # spaced letters
        ("f.u.c.k you", "fuck you"),
        ("s-c-u-m", "scum"),
        ("\U0001f1ee\U0001f1e9\U0001f1ee\U0001f1f4\U0001f1f9", "idiot"),  # regional-indicator letters
        ("\U0001f175\U0001f184\U0001f172\U0001f17a you", "fuck you"),  # negative squared letters
        ("іdіоt", "idiot"),  # Cyrillic і and о inside a Latin word
        ("id\u200biot", "idiot"),  # zero-width space
        ("i\u0335d\u0335i\u0335o\u0335t\u0335", "idiot"),  # strike-through overlays
        ("stuuuupid", "stuupid"),  # stretched letters kept twice
    ],
)
def test_disguises_are_undone(disguised: str, plain: str) -> None:
    assert deobfuscate(disguised) == plain


@pytest.mark.parametrize(
    "text",
    [
        "covid19 cases rose",  # digits only at the end of a word
        "mp3 and 3rd and 10am",
        "I love \U0001f1fa\U0001f1f8 flags",  # a regional-indicator pair is a flag
        "Привет, как дела?",  # a wholly Cyrillic word is Russian, not a disguise
        "Γειά σου κόσμε",
        "नमस्ते दुनिया",  # marks of other scripts are parts of their letters
        "I am a cat, e.g. this one",
        "It costs $5 or 4 euros!",
        "wow!! 1337 is a number, so is 4k",
        "good morning",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert deobfuscate(text) == text


def test_the_encoder_reads_a_disguised_word_as_the_word_only_when_the_card_says_so(tiny_tokenizer: Tokenizer) -> None:
    on = EncodingConfig(normalise_obfuscation=True)
    assert normalise_text("you 1d10t", on) == normalise_text("you idiot", on) == "you idiot"
    assert normalise_text("ｙｏｕ ⓘⓓⓘⓞⓣ", on) == "you idiot"  # full-width and circled: NFKC after the rules
    encoder = DialogueEncoder(tiny_tokenizer, on)
    plain, disguised = encoder.encode_batch([Example(utterance="you idiot"), Example(utterance="y o u 1d10t")])
    assert plain.input_ids == disguised.input_ids
    off = EncodingConfig()  # an older card: no such setting, nothing changes
    assert not off.normalise_obfuscation and normalise_text("you 1d10t", off) == "you 1d10t"
    assert EncodingConfig.from_dict(on.to_dict()) == on
