"""Collages: several posts in one message, OFFENSIVE when one of them is.

A user's message can be long and mostly harmless with one insult in it; the model has to find the
insult, not average it away. Training rows are mostly one short post, so a model can learn that
a long harmless-sounding text is SAFE whatever it contains (measured: a candidate that scored an
insult 0.96 alone scored it 0.25 at the end of 1,200 harmless characters, lab/notes/model.md).
This derived source joins single-turn posts into one message of about :data:`MIN_CHARS` to
:data:`MAX_CHARS` characters (within the first window training reads), in pairs:

* ``one_offensive``: one offensive post (OLID offensive, family ``offensive``; DynaHate hate,
  family ``hateful``) among harmless OLID tweets, at any position: OFFENSIVE, the post's family;
* ``all_safe``: harmless OLID tweets only, of about the same length as its twin: SAFE (family
  ``offensive``: the tweets are labelled not offensive, which is what SAFE says).

OLID's anonymised ``@user`` mentions are dropped from every post (runs of them would mark where a
tweet starts, and so where the DynaHate post without them stands), and tweets with emoji are not
filler (the encoder reads an emoji as its name: a few of them would push the post out of the window).

Length and position therefore predict nothing; the label is the offensive post's, which keeps
its meaning wherever it stands (an insult is an insult in a longer message). Every choice is a
stable hash of the posts. Splits: collages of TRAIN posts are TRAIN, of VALID posts VALID; no TEST
split (the ``long_messages`` suite of ``dialogue-safety evaluate`` builds its own from test posts).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources import dynahate, olid
from dialogue_safety.sources.layout import SourceFiles, Status, derived_from, load_parts
from dialogue_safety.sources.splitting import stable_fraction

SOURCE = "collages"
SALT = "collages-v1"
RATE = 0.25  # share of the offensive posts that get a collage (and a SAFE twin)
MIN_CHARS, MAX_CHARS = 200, 420  # a collage's length (its twin's too): inside training's first window
MIN_PART_CHARS, MAX_PART_CHARS = 10, 160  # a post's length (without mentions): a part, not most of the message
TRIES = 50
SYMBOLS = 0x2000  # code points from here on (punctuation marks, symbols, emoji) keep a tweet out of the filler
_MENTIONS = re.compile(r"@user\b", re.IGNORECASE)
KINDS = ("one_offensive", "all_safe")


def _fraction(key: str, what: str) -> float:
    return stable_fraction(key, f"{SALT}:{what}")


def filler(key: str, pool: Sequence[str], chars: int, limit: int) -> list[str]:
    """Posts of ``pool`` (stable picks per ``key``) until they hold at least ``chars`` characters and
    at most ``limit`` (a pick that would pass ``limit`` is passed over; after :data:`TRIES` such picks
    the filler stops short)."""
    parts: list[str] = []
    total, tries = -1, 0
    while total < chars and tries < TRIES:
        part = pool[int(_fraction(f"{key}|{len(parts)}|{tries}", "pick") * len(pool))]
        if total + 1 + len(part) > limit:
            tries += 1
            continue
        parts.append(part)
        total += 1 + len(part)
    return parts


def without_mentions(text: str) -> str:
    """A tweet without OLID's anonymised ``@user`` mentions (runs of them would mark where a tweet starts)
    and with its HTML entities (``&amp;``) as the characters they stand for."""
    return " ".join(html.unescape(_MENTIONS.sub(" ", text)).split())


def collage_pair(post: LabelledExample, harmless: Sequence[str]) -> tuple[LabelledExample, LabelledExample]:
    """The offensive ``post`` among harmless posts, and a SAFE collage of about the same length."""
    key = f"{post.source}:{post.utterance}"
    text = without_mentions(post.utterance)
    length = MIN_CHARS + int(_fraction(key, "length") * (MAX_CHARS - MIN_CHARS))
    around = filler(key, harmless, length - len(text) - 1, MAX_CHARS - len(text) - 1)
    at = int(_fraction(key, "position") * (len(around) + 1))
    mixed = " ".join([*around[:at], text, *around[at:]])
    safe = " ".join(filler(f"{key}:safe", harmless, len(mixed), MAX_CHARS))

    def row(text: str, label: Label, family: LabelFamily, **meta: object) -> LabelledExample:
        metadata = {"from": post.source, **meta}
        return LabelledExample(
            utterance=text, label=label, source=SOURCE, split=post.split, family=family, metadata=metadata
        )

    return (
        row(mixed, Label.OFFENSIVE, post.family, kind=KINDS[0], position=at, parts=len(around) + 1),
        row(safe, Label.SAFE, LabelFamily.OFFENSIVE, kind=KINDS[1]),
    )


def build(rows: Sequence[LabelledExample], splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for split in (Split.TRAIN, Split.VALID):
        if split not in splits:
            continue
        single = [ex for ex in rows if ex.split is split and not ex.history]
        harmless = [
            text
            for ex in single
            if ex.source == olid.SOURCE and not ex.label.is_positive
            if MIN_PART_CHARS <= len(text := without_mentions(ex.utterance)) <= MAX_PART_CHARS
            and not any(ord(c) >= SYMBOLS for c in text)  # emoji are read as words: many tokens a character
        ]
        if not harmless:
            continue
        for ex in single:
            if not ex.label.is_positive or not MIN_PART_CHARS <= len(without_mentions(ex.utterance)) <= MAX_PART_CHARS:
                continue
            if _fraction(f"{ex.source}:{ex.utterance}", "take") < RATE:
                yield from collage_pair(ex, harmless)


def find(data_dir: Path) -> SourceFiles:
    found = olid.find(data_dir)
    if found.status is Status.MISSING:
        return SourceFiles.missing("derived: needs olid (its harmless tweets are the filler)")
    return derived_from({"olid": found, "dynahate": dynahate.find(data_dir)})


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return build(load_parts(found, {"olid": olid.load, "dynahate": dynahate.load}, splits), splits)
