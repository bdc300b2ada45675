"""Single social-media posts labelled for hate, threats and vulgarity: EDOS and the Gab Hate Corpus.

``edos`` (EDOS, SemEval-2023 Task 10, CC0; ``edos_labelled_aggregated.csv``): Gab and Reddit
posts, ``label_sexist`` "sexist" / "not sexist", ``label_category`` and ``label_vector`` with
numeric prefixes ("1. threats, plans to harm and incitement", "2.3 dehumanising attacks & overt
sexual objectification"; "none" when not sexist), official ``split`` train / dev / test kept.
Sexist is HATEFUL positive (gender is a protected attribute); not sexist is a HATEFUL negative
(the abuse teacher decides whether it still teaches the offensive head 0). ``metadata``:
``category`` / ``vector`` prefixes, ``violence`` (category 1 or not; sexist posts only: EDOS judges a
not-sexist post for sexism alone, and "Start shooting at people who shoot at cops!" is not sexist, so the
``violence`` head learns nothing from such a post), ``sexual`` for vector 2.3.

``ghc`` (Gab Hate Corpus, Kennedy et al. 2022; majority-vote ``GHC_train.tsv`` / ``GHC_test.tsv``,
third-party copy, licence unconfirmed: research only): tab-separated ``text, hd, cv, vo`` with 0/1
labels: hd assault on human dignity, cv call for violence, vo vulgarity. hd or cv is HATEFUL
positive (``violence`` for cv); vo alone is OFFENSIVE positive (vulgarity at anyone); none of the
three is an OFFENSIVE negative. Train and test as given; validation is 10 % of train by a stable
hash of the text. Trap: non-breaking spaces (normalised by the encoder like every text) and
posts that are only a link (kept: they are real traffic and labelled).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import VIOLENCE, Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, split_status
from dialogue_safety.sources.splitting import parse_split, stable_fraction

EDOS = "edos"
GHC = "ghc"
EDOS_DIRS = ("edos", "EDOS")
GHC_DIRS = ("gab-hate-corpus", "gab_hate_corpus", "GabHateCorpus")
EDOS_COLUMNS = ("rewire_id", "text", "label_sexist", "label_category", "label_vector", "split")
EDOS_LABELS = {"sexist": Label.OFFENSIVE, "not sexist": Label.SAFE}
GHC_COLUMNS = ("text", "hd", "cv", "vo")
GHC_FILES = {"train": ["GHC_train.tsv"], "test": ["GHC_test.tsv"]}
GHC_VALID = 0.1


def _prefix(value: str) -> str:
    """The numeric prefix of an EDOS category or vector ("2.3 dehumanising ..." -> "2.3"); "" for none."""
    head = value.strip().split(" ", 1)[0].rstrip(".")
    return head if head and head[0].isdigit() else ""


def read_edos(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for row in read_csv(path, EDOS_COLUMNS):
        split = parse_split(row["split"])
        if split is None:
            raise row.error(f"unknown split {row['split']!r} (expected train, dev or test)")
        label = EDOS_LABELS.get(row["label_sexist"].strip())
        if label is None:
            raise row.error(f"unknown label_sexist {row['label_sexist']!r} (expected 'sexist' or 'not sexist')")
        if split not in splits:
            continue
        category, vector = _prefix(row["label_category"]), _prefix(row["label_vector"])
        if label is Label.OFFENSIVE and not category:
            raise row.error(f"a sexist post without a category ({row['label_category']!r})")
        metadata: dict[str, object] = {"id": row["rewire_id"], "category": category, "vector": vector}
        if label is Label.OFFENSIVE:  # the category (threats or not) is judged for sexist posts only
            metadata[VIOLENCE] = category == "1"
        if vector == "2.3":
            metadata["sexual"] = True
        yield LabelledExample(
            utterance=row.text("text").strip(),
            label=label,
            source=EDOS,
            split=split,
            family=LabelFamily.HATEFUL,
            metadata=metadata,
        )


def _flag(row: CsvRow, column: str) -> bool:
    value = row[column].strip()
    if value not in ("0", "1"):
        raise row.error(f"column {column}: {value!r} (expected 0 or 1)")
    return value == "1"


def read_ghc(path: Path, official: Split, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for row in read_csv(path, GHC_COLUMNS, delimiter="\t"):
        hd, cv, vo = (_flag(row, c) for c in ("hd", "cv", "vo"))
        text = row.text("text").strip()
        split = official
        if official is Split.TRAIN and stable_fraction(text, "ghc-v1") < GHC_VALID:
            split = Split.VALID
        if split not in splits:
            continue
        hateful = hd or cv
        yield LabelledExample(
            utterance=text,
            label=Label.from_bool(hateful or vo),
            source=GHC,
            split=split,
            family=LabelFamily.HATEFUL if hateful else LabelFamily.OFFENSIVE,
            metadata={"hd": hd, "cv": cv, "vo": vo, VIOLENCE: cv, "line": row.line},
        )


def find_edos(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, EDOS_DIRS), {"all": ["edos_labelled_aggregated.csv"]})
    status, note = split_status(found, ["all"])
    return SourceFiles(status, found, note)


def load_edos(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    path = found.files.get("all")
    return read_edos(path, splits) if path is not None else ()


def find_ghc(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, GHC_DIRS), GHC_FILES)
    status, note = split_status(found, GHC_FILES)
    return SourceFiles(status, found, note)


def load_ghc(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    for role, official in (("train", Split.TRAIN), ("test", Split.TEST)):
        path = found.files.get(role)
        if path is not None:
            yield from read_ghc(path, official, splits)
