"""The derived disguised source: copies keep label and family, offensive and harmless alike, with
disguises the encoder's normaliser leaves as they are (so the copies teach something)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dialogue_safety.core.obfuscation import deobfuscate
from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources import disguised
from dialogue_safety.sources.registry import load_source

FULL = Path(__file__).parent / "fixtures" / "sources" / "full"


def _rows(n: int) -> list[LabelledExample]:
    texts = [(f"you are a stupid worthless idiot number {i}", Label.OFFENSIVE) for i in range(n)]
    texts += [(f"have a lovely evening with everyone number {i}", Label.SAFE) for i in range(n)]
    return [
        LabelledExample(utterance=t, label=label, source="olid", split=Split.TRAIN, family=LabelFamily.OFFENSIVE)
        for t, label in texts
    ]


@pytest.mark.parametrize(
    ("word", "kind", "allowed"),
    [
        ("idiot", "masked", {"id*ot", "idi*t"}),
        ("stupid", "edge_swap", {"$tupid"}),  # no swap for a final d: the first letter
        ("idiot", "edge_swap", {"idio7", "1diot"}),
        ("idiot", "split", {"i diot", "id iot", "idi ot", "idio t"}),
        ("rhythm", "masked", {"r hythm", "rh ythm", "rhy thm", "rhyt hm", "rhyth m"}),  # no inner vowel: split
    ],
)
def test_each_disguise(word: str, kind: str, allowed: set[str]) -> None:
    assert disguised.disguise_word(word, kind, "key") in allowed
    with pytest.raises(ValueError, match="unknown disguise"):
        disguised.disguise_word(word, "nope", "key")


def test_copies_keep_labels_at_the_same_rate_and_survive_the_normaliser() -> None:
    rows = _rows(200)
    copies = list(disguised.build(rows, frozenset(Split)))
    by_label = Counter(c.label for c in copies)
    assert 30 <= by_label[Label.OFFENSIVE] <= 70 and 30 <= by_label[Label.SAFE] <= 70  # ~25 % of 200 each
    assert all(c.source == "disguised" and c.family is LabelFamily.OFFENSIVE for c in copies)
    originals = {r.utterance for r in rows}
    assert all(c.utterance not in originals for c in copies)
    # the encoder's normaliser does not undo these: the copies are new to the model
    assert not {deobfuscate(c.utterance) for c in copies} & originals
    assert {c.metadata["kind"] for c in copies} == set(disguised.KINDS)
    assert list(disguised.build(rows, frozenset(Split))) == copies  # a fixed function of the data


def test_loads_from_the_fixture_layout_without_test_rows() -> None:
    rows = load_source("disguised", FULL)
    assert rows and {r.split for r in rows} <= {Split.TRAIN, Split.VALID}
    assert all(not r.history for r in rows)
