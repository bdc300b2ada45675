"""Collages: several posts in one message, OFFENSIVE when one of them is.

A user's message can be long and mostly harmless with one insult in it; the model has to find the
insult, not average it away. Training rows are mostly one short post, so a model can learn that
a long harmless-sounding text is SAFE whatever it contains (measured: a candidate that scored an
insult 0.96 alone scored it 0.25 at the end of 1,200 harmless characters, lab/notes/model.md).
This derived source joins single-turn posts into one message of about :data:`MIN_CHARS` to
:data:`MAX_CHARS` characters (within the first window training reads), in pairs:

* ``one_offensive``: one offensive post (OLID offensive, family ``offensive``; DynaHate hate,
  family ``hateful``) among harmless filler, at any position: OFFENSIVE, the post's family;
* ``all_safe``: harmless filler only, of about the same length as its twin: SAFE (family
  ``offensive``: the filler is labelled not offensive, which is what SAFE says).

The filler of a pair is in one **style** (``metadata["style"]``): ``tweets`` (harmless OLID tweets)
or ``prose`` (Wikipedia Talk comments that raters found not toxic, from ``context_toxicity``,
wiki markup left out): a model trained on a quarter as many collages, all of tweets, scored the insult
0.35 after 1,200 characters of harmless paragraphs and 0.90 alone (candidate-16 at step 2,000,
lab/notes/model.md), so every post gets a collage and half the pairs are prose when the comments are
there. A collage holds at most :data:`MAX_WORDS` words as well: token-dense text fills the window sooner.

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
from dialogue_safety.sources import context_toxicity, dynahate, olid
from dialogue_safety.sources.layout import SourceFiles, Status, derived_from, load_parts
from dialogue_safety.sources.splitting import stable_fraction

SOURCE = "collages"
SALT = "collages-v2"
MIN_CHARS, MAX_CHARS = 200, 420  # a collage's length (its twin's too): inside training's first window
MAX_WORDS = 72  # and words: token-dense text (short words, punctuation) reaches the window's end sooner
MIN_PART_CHARS, MAX_PART_CHARS = 10, 160  # a post's length (without mentions): a part, not most of the message
MIN_PROSE_CHARS, MAX_PROSE_CHARS = 40, 240  # a prose comment's length
STYLES = ("tweets", "prose")
_WIKI_MARKUP = re.compile(r"\[\[|\]\]|\{\{|\}\}|==|~~|''|https?:|www\.|\(UTC\)|\(talk\)", re.IGNORECASE)
TRIES = 50
TWIN_SLACK = 60  # a SAFE twin is at most this many characters longer than its collage
SYMBOLS = 0x2000  # code points from here on (punctuation marks, symbols, emoji) keep a tweet out of the filler
_MENTIONS = re.compile(r"@user\b", re.IGNORECASE)
KINDS = ("one_offensive", "all_safe")


def _fraction(key: str, what: str) -> float:
    return stable_fraction(key, f"{SALT}:{what}")


def filler(key: str, pool: Sequence[str], chars: int, limit: int, words: int = MAX_WORDS) -> list[str]:
    """Posts of ``pool`` (stable picks per ``key``) until they hold at least ``chars`` characters and
    at most ``limit`` characters and ``words`` words (a pick that would pass either is passed over;
    after :data:`TRIES` such picks the filler stops short)."""
    parts: list[str] = []
    total, n_words, tries = -1, 0, 0
    while total < chars and tries < TRIES:
        part = pool[int(_fraction(f"{key}|{len(parts)}|{tries}", "pick") * len(pool))]
        if total + 1 + len(part) > limit or n_words + len(part.split()) > words:
            tries += 1
            continue
        parts.append(part)
        total += 1 + len(part)
        n_words += len(part.split())
    return parts


def without_mentions(text: str) -> str:
    """A tweet without OLID's anonymised ``@user`` mentions (runs of them would mark where a tweet starts)
    and with its HTML entities (``&amp;``) as the characters they stand for."""
    return " ".join(html.unescape(_MENTIONS.sub(" ", text)).split())


def plain(text: str) -> bool:
    """Text a collage can hold: no emoji or symbols (the encoder reads an emoji as its name, many tokens
    a character)."""
    return not any(ord(c) >= SYMBOLS for c in text)


def prose(text: str) -> str | None:
    """A Wikipedia Talk comment as filler (its indentation colons and runs of spaces dropped), or None
    when it is not plain prose of :data:`MIN_PROSE_CHARS` to :data:`MAX_PROSE_CHARS` characters (wiki
    links, templates, headings, signatures and addresses are left out)."""
    text = " ".join(text.lstrip(":* ").split())
    if _WIKI_MARKUP.search(text) or not plain(text) or not MIN_PROSE_CHARS <= len(text) <= MAX_PROSE_CHARS:
        return None
    return text


def collage_pair(post: LabelledExample, harmless: Sequence[str], style: str) -> tuple[LabelledExample, LabelledExample]:
    """The offensive ``post`` among harmless posts, and a SAFE collage of about the same length."""
    key = f"{post.source}:{post.utterance}"
    text = without_mentions(post.utterance)
    length = MIN_CHARS + int(_fraction(key, "length") * (MAX_CHARS - MIN_CHARS))
    around = filler(key, harmless, length - len(text) - 1, MAX_CHARS - len(text) - 1, MAX_WORDS - len(text.split()))
    at = int(_fraction(key, "position") * (len(around) + 1))
    mixed = " ".join([*around[:at], text, *around[at:]])
    safe = " ".join(filler(f"{key}:safe", harmless, len(mixed), min(MAX_CHARS, len(mixed) + TWIN_SLACK)))

    def row(text: str, label: Label, family: LabelFamily, **meta: object) -> LabelledExample:
        metadata = {"from": post.source, "style": style, **meta}
        return LabelledExample(
            utterance=text, label=label, source=SOURCE, split=post.split, family=family, metadata=metadata
        )

    return (
        row(mixed, Label.OFFENSIVE, post.family, kind=KINDS[0], position=at, parts=len(around) + 1),
        row(safe, Label.SAFE, LabelFamily.OFFENSIVE, kind=KINDS[1]),
    )


def pools(rows: Sequence[LabelledExample]) -> dict[str, list[str]]:
    """The harmless filler of each style in ``rows`` (one split): OLID's tweets that are not offensive,
    and the Talk comments raters found not toxic (empty when ``context_toxicity`` is not there)."""
    tweets = [
        text
        for ex in rows
        if ex.source == olid.SOURCE and not ex.label.is_positive and not ex.history
        if MIN_PART_CHARS <= len(text := without_mentions(ex.utterance)) <= MAX_PART_CHARS and plain(text)
    ]
    talk = (prose(ex.utterance) for ex in rows if ex.source == context_toxicity.SOURCE and not ex.label.is_positive)
    comments = sorted({text for text in talk if text is not None})
    return {"tweets": tweets, "prose": comments}


def build(rows: Sequence[LabelledExample], splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for split in (Split.TRAIN, Split.VALID):
        if split not in splits:
            continue
        in_split = [ex for ex in rows if ex.split is split]
        filler_of = {style: pool for style, pool in pools(in_split).items() if pool}
        if "tweets" not in filler_of:
            continue
        styles = [style for style in STYLES if style in filler_of]
        for ex in in_split:
            if ex.source == context_toxicity.SOURCE or ex.history or not ex.label.is_positive:
                continue
            if not MIN_PART_CHARS <= len(without_mentions(ex.utterance)) <= MAX_PART_CHARS:
                continue
            style = styles[int(_fraction(f"{ex.source}:{ex.utterance}", "style") * len(styles))]
            yield from collage_pair(ex, filler_of[style], style)


INPUTS = {"olid": olid, "dynahate": dynahate, "context_toxicity": context_toxicity}


def find(data_dir: Path) -> SourceFiles:
    found = olid.find(data_dir)
    if found.status is Status.MISSING:
        return SourceFiles.missing("derived: needs olid (its harmless tweets are the filler)")
    return derived_from({name: module.find(data_dir) for name, module in INPUTS.items()})


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return build(load_parts(found, {name: module.load for name, module in INPUTS.items()}, splits), splits)
