"""Threats and calls for violence in real posts, read with their corpora's own labels (derived, natural text).

The ``violence`` head (training/harmonise.py) is taught by the sources that label the attribute, and in
0.5.0's mixture those rows were rare: the Gab Hate Corpus's calls for violence (``cv``, 131 train and
validation posts of 22,036) and EDOS's threats (category 1, 354 of 16,000), both corpora at a small weight;
0.5.0's ``violence`` reached test F1 5-17. This source gathers them, from the train and validation splits
only:

* **threats**: every GHC post labelled ``cv`` and every EDOS post of category 1 (threats, plans to harm
  and incitement): ``violence`` true;
* **look-alikes**: posts of the same corpus and split that use a word of harm (:data:`HARM_WORDS`: kill,
  shoot, hang, rape, beat, ...) and whose labels say they are not a threat: ``violence`` false. Up to
  :data:`LOOK_ALIKES_PER_THREAT` per threat, chosen by a stable hash of the text, so the word alone
  decides nothing.

Label, family and metadata are the corpus loader's (``hate_posts``): a GHC call for violence is OFFENSIVE
and *hateful*, an EDOS threat is sexist (OFFENSIVE, *hateful*); a look-alike keeps its own label (an
assault on dignity that is no call for violence is still hateful). ``metadata["corpus"]`` names the corpus
and ``task`` is ``threat_posts/<corpus>``.

Where the labels say "not a threat": GHC's annotators judged ``cv`` on every post. EDOS's category exists
only for sexist posts, so a post EDOS calls not sexist is not judged for threats at all ("Start shooting at
people who shoot at cops!" is not sexist); only sexist posts of another category are look-alikes here
(``hate_posts`` leaves ``violence`` unset on not-sexist posts for the same reason).

CONDA is not read: its labels (explicit / implicit toxicity, game action, other) have no threat
category, and they call "go hang urself" and "kys" *other* and "kill yourself" *explicit*: nothing there
says which utterance is a threat.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from dialogue_safety.core.schema import VIOLENCE, LabelledExample, Split
from dialogue_safety.sources import hate_posts
from dialogue_safety.sources.layout import SourceFiles, derived_from, load_parts
from dialogue_safety.sources.splitting import stable_fraction

SOURCE = "threat_posts"
SALT = "threat-posts-v1"
CORPORA = {hate_posts.GHC: hate_posts.load_ghc, hate_posts.EDOS: hate_posts.load_edos}
FINDERS = {hate_posts.GHC: hate_posts.find_ghc, hate_posts.EDOS: hate_posts.find_edos}
LOOK_ALIKES_PER_THREAT = 2
# words of physical harm: a post using one and labelled "not a threat" is a look-alike (a key that selects
# corpus rows, not a text of its own)
HARM_WORDS = frozenset(
    """
    kill kills killed killing killer killers murder murders murdered murdering murderer shoot shoots shooting
    shot shots gun guns gunned bullet bullets stab stabs stabbed stabbing hang hangs hanged hanging lynch
    lynched lynching rope beat beats beating beaten punch punched punching slap slapped kick kicked kicking
    burn burned burnt burning rape raped rapes raping execute executed execution die dies died dying dead
    death deaths bomb bombs bombed bombing strangle strangled choke choked choking hurt hurts hurting attack
    attacks attacked attacking slaughter slaughtered torture tortured exterminate exterminated extermination
    """.split()  # noqa: SIM905 - a paragraph of words reads better than 88 quoted lines
)
_WORD = re.compile(r"[a-z]+")


def harm_word(text: str) -> str | None:
    """The first word of harm in ``text`` (lower case), or None."""
    return next((w for w in _WORD.findall(text.lower()) if w in HARM_WORDS), None)


def judged(ex: LabelledExample) -> bool:
    """Whether the corpus labelled the post for threats (``metadata["violence"]`` present)."""
    return VIOLENCE in ex.metadata


def build(rows: Sequence[LabelledExample], splits: frozenset[Split]) -> Iterator[LabelledExample]:
    """Threats and their look-alikes of each corpus and split (train and valid only), in row order."""
    for corpus in CORPORA:
        for split in (Split.TRAIN, Split.VALID):
            if split not in splits:
                continue
            part = [ex for ex in rows if ex.source == corpus and ex.split is split and judged(ex)]
            threats = [ex for ex in part if ex.metadata[VIOLENCE]]
            candidates = [ex for ex in part if not ex.metadata[VIOLENCE] and harm_word(ex.utterance)]
            candidates.sort(key=lambda ex: stable_fraction(ex.utterance, SALT))
            chosen = {id(ex) for ex in candidates[: LOOK_ALIKES_PER_THREAT * len(threats)]}
            for ex in part:
                if ex.metadata[VIOLENCE] or id(ex) in chosen:
                    yield replace(
                        ex,
                        source=SOURCE,
                        task=f"{SOURCE}/{corpus}",
                        metadata={**ex.metadata, "corpus": corpus, "harm_word": harm_word(ex.utterance)},
                    )


def find(data_dir: Path) -> SourceFiles:
    return derived_from({name: finder(data_dir) for name, finder in FINDERS.items()})


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return build(load_parts(found, CORPORA, splits), splits)
