"""Wikipedia Talk comments labelled toxic with and without their parent (Pavlopoulos et al. 2020).

``cat_small.csv`` (CAT-SMALL): ``text, parent_text, tox_codes_oc, label_oc, tox_codes_ic,
label_ic``; the same comment labelled by raters who saw it alone (``_oc``) and by raters who
also saw the parent (``_ic``). ``gc.csv`` (CAT-LARGE, "in context"): ``id, text, parent, label,
api``, 10,000 comments labelled with the parent shown. ``gn.csv`` ("no context"): ``id, text,
label, api, parent``, 10,000 other comments labelled alone (trap: the same columns in another
order, and ``parent`` always empty). ``api`` is a Perspective score, a machine's, never read.

Mapping (the family is OFFENSIVE: Perspective-style "toxic", rude or disrespectful at anyone):

* CAT-SMALL (label alone, label in context): (1, 1) OFFENSIVE with the parent as history; (0, 1)
  OFFENSIVE *in context* (family UNSAFE_IN_CONTEXT: the parent makes it toxic); (0, 0) SAFE with
  the parent; (1, 0) is not used (toxic alone but not in context: a label the decomposed verdict
  cannot follow, since the utterance heads judge the words).
* gc: toxic in context is UNSAFE_IN_CONTEXT positive (whether the words alone are toxic was not
  asked); not toxic is SAFE with the parent.
* gn: the comment alone, no history, OFFENSIVE positive or SAFE.

No official splits: 80/10/10 by a stable hash of the comment's ``id`` (CAT-SMALL: of its text).
CAT-LARGE is 1.5 % / 0.6 % toxic: mostly clean negatives with a context.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, split_status
from dialogue_safety.sources.splitting import three_way_split

SOURCE = "context_toxicity"
DIRS = ("context-toxicity-cat", "context_toxicity", "CAT")
FILES = {"small": ["cat_small.csv"], "gc": ["gc.csv"], "gn": ["gn.csv"]}
SALT = "context-toxicity-v1"


def _label(row: CsvRow, column: str) -> bool:
    value = row[column].strip()
    if value not in ("0", "1"):
        raise row.error(f"column {column}: {value!r} (expected 0 or 1)")
    return value == "1"


def _example(
    text: str, parent: str, label: Label, family: LabelFamily, split: Split, task: str, meta: Mapping[str, object]
) -> LabelledExample:
    return LabelledExample(
        utterance=text.strip(),
        history=(Turn(parent.strip()),) if parent.strip() else (),
        label=label,
        source=SOURCE,
        split=split,
        family=family,
        task=f"{SOURCE}/{task}",
        metadata=meta,
    )


def read_small(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for row in read_csv(path, ("text", "parent_text", "label_oc", "label_ic")):
        alone, in_context = _label(row, "label_oc"), _label(row, "label_ic")
        text = row.text("text")
        split = three_way_split(text.strip(), SALT)
        if split not in splits or (alone and not in_context):
            continue
        family = LabelFamily.UNSAFE_IN_CONTEXT if in_context and not alone else LabelFamily.OFFENSIVE
        meta = {"label_alone": alone, "label_in_context": in_context, "line": row.line}
        yield _example(text, row["parent_text"], Label.from_bool(in_context), family, split, "small", meta)


def read_large(path: Path, in_context: bool, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for row in read_csv(path, ("id", "text", "label", "parent")):
        toxic = _label(row, "label")
        split = three_way_split(row["id"].strip(), SALT)
        if split not in splits:
            continue
        family = LabelFamily.UNSAFE_IN_CONTEXT if in_context and toxic else LabelFamily.OFFENSIVE
        parent = row["parent"] if in_context else ""
        task = "gc" if in_context else "gn"
        meta = {"id": row["id"], "line": row.line}
        yield _example(row.text("text"), parent, Label.from_bool(toxic), family, split, task, meta)


def find(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, DIRS), FILES)
    status, note = split_status(found, FILES)
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    if (path := found.files.get("small")) is not None:
        yield from read_small(path, splits)
    for role, in_context in (("gc", True), ("gn", False)):
        if (path := found.files.get(role)) is not None:
            yield from read_large(path, in_context, splits)
