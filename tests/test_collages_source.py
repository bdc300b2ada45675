"""The derived collages source: one offensive post among harmless ones is OFFENSIVE, a collage of harmless
ones is SAFE, in pairs of about the same length, and every collage fits the window training reads."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from dialogue_safety.core.schema import Example, Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources import collages
from dialogue_safety.sources.registry import load_source

FULL = Path(__file__).parent / "fixtures" / "sources" / "full"
MODEL = Path(__file__).parent.parent / "models" / "default"

HARMLESS = [
    "@user @user we walked to the old mill on sunday and bought bread",
    "the new library opens next week, can't wait to see the reading room",
    "my sister baked a lemon tart for the whole street 🍋",
    "rain all day again, good weather for finishing a book",
    "@user thanks for the tip about the bike shop, they fixed it in an hour",
]

COMMENTS = [
    "::I have moved the paragraph about the bridge to the history section, where it fits better.",
    "Thanks for the reference, I will add the page numbers once I find my copy of the book.",
    "See [[Talk:Old Mill]] for the earlier discussion of this photo.",  # wiki markup: not filler
    "The infobox says 1872 but the text says 1876; which year does the source give?",
]


def _rows() -> list[LabelledExample]:
    def row(text: str, label: Label, source: str, family: LabelFamily, split: Split = Split.TRAIN) -> LabelledExample:
        return LabelledExample(utterance=text, label=label, source=source, split=split, family=family)

    off, hate, safe = LabelFamily.OFFENSIVE, LabelFamily.HATEFUL, Label.SAFE
    rows = [row(f"{t} ({i})", safe, "olid", off) for i in range(40) for t in HARMLESS]
    rows += [row(f"@user you are a pathetic idiot number {i}", Label.OFFENSIVE, "olid", off) for i in range(200)]
    rows += [row(f"those people are vermin, hate them ({i})", Label.OFFENSIVE, "dynahate", hate) for i in range(200)]
    rows += [row(f"test split idiot {i}", Label.OFFENSIVE, "olid", off, Split.TEST) for i in range(50)]
    rows += [row(f"{t} ({i})", safe, "context_toxicity", off) for i in range(30) for t in COMMENTS]
    rows += [row(f"Wikipedia comment, toxic: idiot {i}", Label.OFFENSIVE, "context_toxicity", off) for i in range(30)]
    with_history = replace(row("you idiot", Label.OFFENSIVE, "olid", off), history=(Turn("hi", "user"),))
    return [*rows, with_history]


def test_pairs_of_one_offensive_post_and_none_of_about_the_same_length() -> None:
    rows = _rows()
    built = list(collages.build(rows, frozenset(Split)))
    assert built == list(collages.build(rows, frozenset(Split)))  # a fixed function of the data
    offensive, safe = built[0::2], built[1::2]
    assert {c.metadata["kind"] for c in offensive} == {"one_offensive"} and {c.metadata["kind"] for c in safe} == {
        "all_safe"
    }
    assert len(offensive) == 400  # every train post; none of the test split, with a history or from the comments
    assert {c.split for c in built} == {Split.TRAIN} and all(not c.history and c.source == "collages" for c in built)
    assert Counter(c.family for c in offensive).keys() == {LabelFamily.OFFENSIVE, LabelFamily.HATEFUL}
    assert all(c.label is Label.OFFENSIVE for c in offensive) and all(c.label is Label.SAFE for c in safe)
    assert all(c.family is LabelFamily.OFFENSIVE for c in safe)
    for mixed, twin in zip(offensive, safe, strict=True):
        assert sum(w in mixed.utterance for w in ("idiot", "vermin")) == 1  # the one post, once
        assert "idiot" not in twin.utterance and "vermin" not in twin.utterance
        assert collages.MIN_CHARS - 60 <= len(mixed.utterance) <= collages.MAX_CHARS
        assert abs(len(twin.utterance) - len(mixed.utterance)) <= 80 and len(twin.utterance) <= collages.MAX_CHARS
        assert "@user" not in mixed.utterance + twin.utterance and "🍋" not in mixed.utterance + twin.utterance
        assert mixed.metadata["style"] == twin.metadata["style"]
        assert "[[" not in mixed.utterance + twin.utterance and "::" not in mixed.utterance + twin.utterance
        filler = HARMLESS if mixed.metadata["style"] == "tweets" else COMMENTS
        words = {w for text in filler for w in text.split()[2:5]}
        assert any(w in twin.utterance for w in words), (mixed.metadata["style"], twin.utterance)
    styles = Counter(c.metadata["style"] for c in offensive)
    assert styles.keys() == {"tweets", "prose"} and min(styles.values()) > 120, styles  # about half each
    tweets_only = [ex for ex in rows if ex.source != "context_toxicity"]
    assert {c.metadata["style"] for c in collages.build(tweets_only, frozenset(Split))} == {"tweets"}
    positions = Counter(c.metadata["position"] == 0 for c in offensive)
    assert positions[True] and positions[False]  # at the start and further in


def test_every_collage_fits_the_first_window_training_reads() -> None:
    from dialogue_safety.core.runtime import OnnxClassifier

    rows = load_source("collages", FULL) + list(collages.build(_rows(), frozenset(Split)))
    assert rows and {r.split for r in rows} <= {Split.TRAIN, Split.VALID}
    encoder = OnnxClassifier(MODEL).encoder
    encoded = encoder.encode_batch([Example(utterance=r.utterance) for r in rows], max_windows=None)
    assert all(not e.more for e in encoded), [r.utterance for r, e in zip(rows, encoded, strict=True) if e.more][:3]
