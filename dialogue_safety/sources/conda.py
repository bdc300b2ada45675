"""CONDA (Weld et al. 2021): Dota 2 in-game chat, each utterance labelled with its conversation.

Files ``CONDA_{train,valid,test}.csv`` with columns ``Id, matchId, conversationId, utterance,
chatTime, playerSlot, playerId`` and, in train and valid only, ``intentClass`` (E explicit
toxicity, I implicit toxicity, A game action, O other). The test file is unlabelled and is read
only to rebuild conversations.

Traps handled here:

* **Shuffled rows, conversations split across files**: the history of an utterance is the
  turns of its ``conversationId`` in **all three files**, sorted by ``chatTime`` (then ``Id`` for
  ties), that come before it; the last :data:`HISTORY_TURNS` are kept. The speaker is
  ``player<slot>`` (the Steam display names are not read: some are offensive themselves).
* **The official split is by utterance** (context leaks across it): labelled utterances are
  re-split 80/10/10 by a stable hash of ``matchId``, so a match is in one split only.
* ``[SEPA]`` joins consecutive lines of one player: it becomes a newline, the same everywhere.

Mapping: E is OFFENSIVE (family OFFENSIVE: toxic by its words); I is OFFENSIVE in context
(family UNSAFE_IN_CONTEXT: implicit toxicity often needs the conversation); A and O are SAFE
(family OFFENSIVE). Gaming slang ("gg", "ez", "report") and insults to game play labelled O are
the annotators' threshold and kept as they are.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.files import CsvRow, read_csv
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, split_status
from dialogue_safety.sources.splitting import three_way_split

SOURCE = "conda"
DIRS = ("conda", "CONDA")
FILES = {name: [f"CONDA_{name}.csv"] for name in ("train", "valid", "test")}
COLUMNS = ("Id", "matchId", "conversationId", "utterance", "chatTime", "playerSlot")
LABELLED = ("train", "valid")
HISTORY_TURNS = 3
SEPARATOR = "[SEPA]"
SALT = "conda-v1"
INTENTS = {
    "E": (Label.OFFENSIVE, LabelFamily.OFFENSIVE),
    "I": (Label.OFFENSIVE, LabelFamily.UNSAFE_IN_CONTEXT),
    "A": (Label.SAFE, LabelFamily.OFFENSIVE),
    "O": (Label.SAFE, LabelFamily.OFFENSIVE),
}


@dataclass(frozen=True)
class _Line:
    time: int
    row_id: int
    text: str
    speaker: str
    match: str
    intent: str | None
    where: str


def clean(text: str) -> str:
    """The utterance with ``[SEPA]`` as a newline and the spaces around it trimmed."""
    return "\n".join(part.strip() for part in text.split(SEPARATOR) if part.strip())


def _int(row: CsvRow, column: str) -> int:
    try:
        return int(row[column].strip())
    except ValueError:
        raise row.error(f"column {column}: {row[column]!r} is not an integer") from None


def _line(row: CsvRow, labelled: bool) -> _Line:
    intent = None
    if labelled:
        intent = row.get("intentClass").strip()
        if intent not in INTENTS:
            raise row.error(f"unknown intentClass {intent!r} (expected one of {', '.join(INTENTS)})")
    return _Line(
        time=_int(row, "chatTime"),
        row_id=_int(row, "Id"),
        text=clean(row["utterance"]),
        speaker=f"player{row['playerSlot'].strip()}",
        match=row["matchId"].strip(),
        intent=intent,
        where=f"{row.path.name}:{row.line}",
    )


def conversations(found: SourceFiles) -> dict[str, list[_Line]]:
    """Every conversation's lines from all files, in chat order."""
    by_conversation: dict[str, list[_Line]] = defaultdict(list)
    for name in FILES:
        path = found.files.get(name)
        if path is None:
            continue
        labelled = name in LABELLED
        required = (*COLUMNS, "intentClass") if labelled else COLUMNS
        for row in read_csv(path, required):
            by_conversation[row["conversationId"].strip()].append(_line(row, labelled))
    for lines in by_conversation.values():
        lines.sort(key=lambda line: (line.time, line.row_id))
    return by_conversation


def examples(by_conversation: dict[str, list[_Line]], splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for conversation, lines in by_conversation.items():
        for i, line in enumerate(lines):
            if line.intent is None or not line.text:
                continue
            split = three_way_split(line.match, SALT)
            if split not in splits:
                continue
            label, family = INTENTS[line.intent]
            history = [h for h in lines[:i] if h.text][-HISTORY_TURNS:]
            yield LabelledExample(
                utterance=line.text,
                history=tuple(Turn(h.text, h.speaker) for h in history),
                label=label,
                source=SOURCE,
                split=split,
                family=family,
                metadata={"intent": line.intent, "match": line.match, "conversation": conversation, "row": line.where},
            )


def find(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, DIRS), FILES)
    status, note = split_status(found, FILES)
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return examples(conversations(found), splits)
