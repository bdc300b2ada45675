"""Replies to hateful turns: counter-speech, endorsements and neutral replies (four sources).

Each source's labels are mapped onto the served definition (OFFENSIVE: insults, threats,
profanity at anyone, hate, and in context agreeing with hate or encouraging harm) as written
below; ``tests/test_counter_speech_sources.py`` checks every mapping on fixture rows.

``conan`` (CONAN family, Guerini lab; **research only, may not be redistributed**: read from the
data directory, never copied into this repository):

* Multi-Target CONAN ``Multitarget-CONAN.csv``: a hateful turn → an expert-reviewed civil
  counter-narrative. The counter-narrative after its hateful turn is SAFE (family
  UNSAFE_IN_CONTEXT: a civil reply that does not endorse the history; ``kind=counter_narrative``);
  each distinct hateful text alone is OFFENSIVE (family HATEFUL; ``kind=hate_speech``).
* DIALOCONAN ``DIALOCONAN.csv``: hater/operator dialogues. Every CN turn after the turns before it
  is SAFE (counter_narrative), every HS turn OFFENSIVE (hate_speech, with its history).
* No official splits: Multi-Target pairs are split 80/10/10 by a stable hash of the hateful text
  (every counter-narrative of one hateful text lands in the same split, and so does that text
  alone); DIALOCONAN by dialogue id. The CONAN (Islamophobia) and knowledge-grounded files are not
  read.

``yu2022`` (Yu et al. 2022, Reddit (context, reply), gold train/val/test as given; silver not read):
label 0 hate → OFFENSIVE (family OFFENSIVE: hate or an attack on the author); 1 neutral and
2 counter-hate → SAFE *in context only* (family UNSAFE_IN_CONTEXT, ``utterance_unlabelled``:
the reply does not endorse the context, but Reddit counter-hate is often itself insulting, so the
label says nothing of the utterance alone).

``hickey2025`` (toxic-counterspeech, MIT): ``yu_et_al_2023.csv`` replies to hateful posts:
``agree`` → OFFENSIVE (UNSAFE_IN_CONTEXT: agreeing with hate; ``kind=endorsement``); every other
category (neutral, claim, insult, ...) → SAFE in context only (``utterance_unlabelled``;
``kind=counter`` or ``neutral``); split 80/10/10 by the hateful post's id. ``validation_set.csv``
(human-labelled): 1 hate → OFFENSIVE (family OFFENSIVE); 0 other and 2 counterspeech → SAFE in
context only; split by the newcomer's id. The GPT-4o-labelled file is not read (its labels are a
model's, and must never be tested on).

``hickey2024`` (hostile counterspeech triplets context → newcomer → reply): a reply labelled a
personal attack → OFFENSIVE (family OFFENSIVE, history = context and newcomer); a counterspeech
reply or newcomer that is no attack → SAFE in context only; other rows are unlabelled for our
purpose and skipped. Split 80/10/10 by the triplet id.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from dialogue_safety.core.schema import UTTERANCE_UNLABELLED, Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_csv, read_jsonl
from dialogue_safety.sources.layout import SourceFiles, Status, existing_dirs, find_files, split_status
from dialogue_safety.sources.splitting import three_way_split

CONAN = "conan"
YU2022 = "yu2022"
HICKEY2025 = "hickey2025"
HICKEY2024 = "hickey2024"
SALT = "counter-speech-v1"


def _example(
    source: str,
    utterance: str,
    history: Iterable[str],
    label: Label,
    family: LabelFamily,
    split: Split,
    kind: str,
    meta: Mapping[str, object],
    *,
    unlabelled: bool = False,
) -> LabelledExample:
    metadata: dict[str, object] = {"kind": kind, **meta}
    if unlabelled:
        metadata[UTTERANCE_UNLABELLED] = True
    return LabelledExample(
        utterance=utterance.strip(),
        history=tuple(Turn(t.strip()) for t in history),
        label=label,
        source=source,
        split=split,
        family=family,
        task=f"{source}/{kind}",
        metadata=metadata,
    )


def _context_safe(
    source: str, utterance: str, history: Iterable[str], split: Split, kind: str, meta: Mapping[str, object]
) -> LabelledExample:
    """A reply that does not endorse its context, whose own civility the source does not say."""
    return _example(
        source, utterance, history, Label.SAFE, LabelFamily.UNSAFE_IN_CONTEXT, split, kind, meta, unlabelled=True
    )


# -- CONAN ---------------------------------------------------------------------------------------
CONAN_DIRS = ("conan", "CONAN")


def find_conan(data_dir: Path) -> SourceFiles:
    roles = {"multitarget": ["Multitarget-CONAN.csv"], "dialoconan": ["DIALOCONAN.csv"]}
    found = find_files(existing_dirs(data_dir, CONAN_DIRS), roles)
    status, note = split_status(found, roles)
    return SourceFiles(status, found, note)


def read_multitarget(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    seen: set[str] = set()
    for row in read_csv(path, required=("HATE_SPEECH", "COUNTER_NARRATIVE", "TARGET")):
        hate, counter = row.text("HATE_SPEECH"), row.text("COUNTER_NARRATIVE")
        split = three_way_split(" ".join(hate.split()).lower(), SALT + ":multitarget")
        if split not in splits:
            continue
        meta = {"target": row["TARGET"], "line": row.line, "part": "multitarget"}
        yield _example(
            CONAN, counter, [hate], Label.SAFE, LabelFamily.UNSAFE_IN_CONTEXT, split, "counter_narrative", meta
        )
        if hate not in seen:
            seen.add(hate)
            yield _example(CONAN, hate, [], Label.OFFENSIVE, LabelFamily.HATEFUL, split, "hate_speech", meta)


def read_dialoconan(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    dialogues: dict[str, list[tuple[int, str, str, str, int]]] = {}
    for row in read_csv(path, required=("text", "TARGET", "dialogue_id", "turn_id", "type")):
        kind = row["type"].strip()
        if kind not in ("HS", "CN"):
            raise row.error(f"unknown turn type {kind!r} (expected HS or CN)")
        try:
            turn = int(row["turn_id"])
        except ValueError:
            raise row.error(f"turn_id {row['turn_id']!r} is not an integer") from None
        dialogues.setdefault(row["dialogue_id"].strip(), []).append((turn, kind, row["text"], row["TARGET"], row.line))
    for dialogue_id, turns in dialogues.items():
        split = three_way_split(dialogue_id, SALT + ":dialoconan")
        if split not in splits:
            continue
        history: list[str] = []
        for _, kind, text, target, line in sorted(turns):
            if not text.strip():
                continue  # two turns of dialogue 1369 are empty upstream
            meta = {"target": target, "line": line, "dialogue_id": dialogue_id, "part": "dialoconan"}
            if kind == "CN":
                yield _example(
                    CONAN, text, history, Label.SAFE, LabelFamily.UNSAFE_IN_CONTEXT, split, "counter_narrative", meta
                )
            else:
                yield _example(CONAN, text, history, Label.OFFENSIVE, LabelFamily.HATEFUL, split, "hate_speech", meta)
            history.append(text)


def load_conan(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    if (path := found.files.get("multitarget")) is not None:
        yield from read_multitarget(path, splits)
    if (path := found.files.get("dialoconan")) is not None:
        yield from read_dialoconan(path, splits)


# -- Yu et al. 2022 ------------------------------------------------------------------------------
YU_DIRS = ("counter-context-yu2022", "counter_context", "counter_context/data")
YU_SPLITS = {"train": Split.TRAIN, "val": Split.VALID, "test": Split.TEST}


def find_yu2022(data_dir: Path) -> SourceFiles:
    roles = {name: [f"gold/{name}.jsonl"] for name in YU_SPLITS}
    found = find_files(existing_dirs(data_dir, YU_DIRS), roles)
    status, note = split_status(found, roles)
    return SourceFiles(status, found, note)


def read_yu2022(path: Path, split: Split) -> Iterator[LabelledExample]:
    for line, record in read_jsonl(path):
        if not isinstance(record, dict) or not {"label", "context", "target"} <= set(record):
            raise DatasetFormatError(path, "expected an object with label, context and target", line=line)
        label, context, reply = str(record["label"]).strip(), str(record["context"]), str(record["target"])
        if not reply.strip():
            continue
        history = [context] if context.strip() else []
        meta = {"line": line, "idx": record.get("idx")}
        if label == "0":
            yield _example(YU2022, reply, history, Label.OFFENSIVE, LabelFamily.OFFENSIVE, split, "hate", meta)
        elif label in ("1", "2"):
            yield _context_safe(YU2022, reply, history, split, "neutral" if label == "1" else "counter", meta)
        else:
            raise DatasetFormatError(path, f"unknown label {label!r} (expected 0, 1 or 2)", line=line)


def load_yu2022(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    for name, split in YU_SPLITS.items():
        if split in splits and (path := found.files.get(name)) is not None:
            yield from read_yu2022(path, split)


# -- Hickey et al. 2025 --------------------------------------------------------------------------
HICKEY2025_DIRS = ("toxic-counterspeech-hickey2025", "toxic-counterspeech/data/model_training")


def find_hickey2025(data_dir: Path) -> SourceFiles:
    roles = {"replies": ["yu_et_al_2023.csv"], "human": ["validation_set.csv"]}
    found = find_files(existing_dirs(data_dir, HICKEY2025_DIRS), roles)
    status, note = split_status(found, roles)
    return SourceFiles(status, found, note)


def read_hickey_replies(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for row in read_csv(path, required=("Hate_ID", "parent", "reply", "Gold_label")):
        reply, parent = row["reply"], row["parent"]
        if not reply.strip():
            continue
        split = three_way_split(row["Hate_ID"].strip(), SALT + ":hickey2025")
        if split not in splits:
            continue
        gold = row["Gold_label"].strip().lower()
        history = [parent] if parent.strip() else []
        meta = {"line": row.line, "category": gold or "neutral"}
        if gold == "agree":
            yield _example(
                HICKEY2025, reply, history, Label.OFFENSIVE, LabelFamily.UNSAFE_IN_CONTEXT, split, "endorsement", meta
            )
        else:
            yield _context_safe(
                HICKEY2025, reply, history, split, "neutral" if gold in ("", "neutral") else "counter", meta
            )


def read_hickey_human(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for row in read_csv(path, required=("id", "parent", "reply", "label")):
        reply, parent, label = row["reply"], row["parent"], row["label"].strip()
        if not reply.strip():
            continue
        split = three_way_split(row["id"].strip(), SALT + ":hickey2025-human")
        if split not in splits:
            continue
        history = [parent] if parent.strip() else []
        meta = {"line": row.line, "role": row.get("target")}
        if label == "1":
            yield _example(HICKEY2025, reply, history, Label.OFFENSIVE, LabelFamily.OFFENSIVE, split, "hate", meta)
        elif label in ("0", "2"):
            yield _context_safe(HICKEY2025, reply, history, split, "other" if label == "0" else "counter", meta)
        else:
            raise row.error(f"unknown label {label!r} (expected 0, 1 or 2)")


def load_hickey2025(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    if (path := found.files.get("replies")) is not None:
        yield from read_hickey_replies(path, splits)
    if (path := found.files.get("human")) is not None:
        yield from read_hickey_human(path, splits)


# -- Hickey et al. 2024 --------------------------------------------------------------------------
HICKEY2024_DIRS = ("hostile-counterspeech-hickey2024", "reddit-counterspeech/data")


def find_hickey2024(data_dir: Path) -> SourceFiles:
    roles = {"triplets": ["counterspeech_dataset.csv"]}
    found = find_files(existing_dirs(data_dir, HICKEY2024_DIRS), roles)
    return SourceFiles(Status.COMPLETE if found else Status.MISSING, found)


def _flag(row: object, column: str) -> bool:
    value = row[column].strip()  # type: ignore[index]
    if value not in ("0", "1", "0.0", "1.0"):
        raise row.error(f"{column} must be 0 or 1, got {value!r}")  # type: ignore[attr-defined]
    return value.startswith("1")


def read_hickey2024(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    required = ("id", "context", "newcomer", "reply", "newcomer_counterspeech", "reply_counterspeech", "reply_attack")
    for row in read_csv(path, required=required):
        split = three_way_split(row["id"].strip(), SALT + ":hickey2024")
        if split not in splits:
            continue
        context, newcomer, reply = row["context"], row["newcomer"], row["reply"]
        meta = {"line": row.line}
        if _flag(row, "newcomer_counterspeech") and newcomer.strip():
            yield _context_safe(HICKEY2024, newcomer, [context], split, "counter", meta)
        if not reply.strip():
            continue
        if _flag(row, "reply_attack"):
            yield _example(
                HICKEY2024, reply, [context, newcomer], Label.OFFENSIVE, LabelFamily.OFFENSIVE, split, "attack", meta
            )
        elif _flag(row, "reply_counterspeech"):
            yield _context_safe(HICKEY2024, reply, [context, newcomer], split, "counter", meta)


def load_hickey2024(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    if (path := found.files.get("triplets")) is not None:
        yield from read_hickey2024(path, splits)
