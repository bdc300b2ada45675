"""Bot-Adversarial Dialogue's validation split as the Few-Shot Bot repository re-wrote it (JSON).

BAD (Xu et al. 2021) is the multi-turn adversarial chatbot data of the mission: crowdworkers try
to goad a bot into unsafe replies, and every human and bot turn is labelled OK / not OK *in its
dialogue*. The FSB repository (andreamad8/FSB, ``data/safety_layers/``) holds all 7,002 labelled
turns of the official ``valid.txt`` in two files:

* ``safety_adv.json``: every ``__notok__`` turn (OFFENSIVE), the **whole** dialogue up to it;
* ``safety_safe_adv_valid.json``: every ``__ok__`` turn (SAFE), only its **last two pairs**.

Each record is ``{"dialogue": [[turn, turn], ...], "meta"?: [persona lines]}``: the turns cut
into pairs, an empty string closing an odd-length dialogue. The labelled utterance is the last
non-empty turn. BAD dialogues open with the human, so an odd number of turns means a human
utterance, an even number a bot one (``metadata["speaker"]``; turns alternate backwards from it).

Traps handled here:

* **Length**: OFFENSIVE records keep the whole dialogue, SAFE ones at most four turns, so "long
  history means unsafe" would be learnable. Every record keeps the utterance and its last
  :data:`~dialogue_safety.sources.bad.BAD_NUM_TURNS` - 1 history turns (ParlAI's
  ``bad_num_turns=4``, the setting of the published results); the speaker is read before the cut.
* **No split inside the file**: records are grouped into dialogues (records that share a
  ``[human, bot]`` pair belong to one dialogue: a SAFE record's pairs are a suffix of its
  dialogue, which its OFFENSIVE records hold whole) and split 80/10/10 by a stable hash of the
  group's earliest pair, so no dialogue is in two splits. BAD's official test split is not here
  and must never be trained on.

The family is BAD's (:data:`dialogue_safety.sources.bad.FAMILY`, unsafe in context): the label is
about the turn in its dialogue, so with the decomposed verdict it teaches the context head, and a
SAFE turn teaches every head 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import Label, LabelledExample, Split, Turn
from dialogue_safety.sources.bad import BAD_NUM_TURNS, FAMILY, SPEAKERS
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_json
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, split_status
from dialogue_safety.sources.splitting import three_way_split

SOURCE = "bad_fsb"
DIRS = ("bad-valid-fsb", "bad_valid_fsb", "FSB/data/safety_layers")
FILES = {"unsafe": ["safety_adv.json"], "safe": ["safety_safe_adv_valid.json"]}
LABELS = {"unsafe": Label.OFFENSIVE, "safe": Label.SAFE}
SALT = "bad-fsb-v1"

Pair = tuple[str, str]


def _record_turns(record: Any, path: Path, index: int) -> tuple[list[Pair], list[str]]:
    """The record's pairs (as given) and its turns (the closing empty string dropped)."""
    where = f"record {index}"
    if not isinstance(record, dict) or not isinstance(record.get("dialogue"), list) or not record["dialogue"]:
        raise DatasetFormatError(path, f"{where}: expected an object with a non-empty 'dialogue' list")
    pairs: list[Pair] = []
    for pair in record["dialogue"]:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise DatasetFormatError(path, f"{where}: every dialogue entry must be a pair of strings, got {pair!r:.80}")
        pairs.append((pair[0], pair[1]))
    turns = [t for pair in pairs for t in pair]
    if turns[-1] == "":
        turns.pop()
    if not turns or any(not t.strip() for t in turns):
        raise DatasetFormatError(path, f"{where}: an empty turn inside the dialogue")
    return pairs, turns


class _Groups:
    """Union-find over records that share a pair: the records of one dialogue."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, i: int) -> int:
        root = i
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while self.parent.get(i, i) != root:  # path compression
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def dialogue_keys(records: Sequence[list[Pair]]) -> list[str]:
    """For each record (its pairs), the key of its dialogue: the smallest complete pair of its group.

    Records sharing a complete ``[human, bot]`` pair are one dialogue. The key does not depend on
    record order, so the split is a fixed function of the data.
    """
    groups = _Groups()
    first_with: dict[Pair, int] = {}
    for i, pairs in enumerate(records):
        for pair in pairs:
            if not pair[1]:
                continue  # an odd dialogue's last half-pair is the utterance alone: too generic to join on
            j = first_with.setdefault(pair, i)
            groups.union(i, j)
    smallest: dict[int, str] = {}
    for i, pairs in enumerate(records):
        root = groups.find(i)
        for pair in pairs:
            key = "\x1f".join(pair)
            if root not in smallest or key < smallest[root]:
                smallest[root] = key
    return [smallest[groups.find(i)] for i in range(len(records))]


def examples_from_records(
    records: Sequence[tuple[str, Any]], path_of: dict[str, Path], splits: frozenset[Split]
) -> Iterator[LabelledExample]:
    """``records`` are ``(role, record)`` with role ``unsafe`` or ``safe``, in file order."""
    parsed = []
    for index, (role, record) in enumerate(records):
        pairs, turns = _record_turns(record, path_of[role], index)
        parsed.append((role, pairs, turns))
    keys = dialogue_keys([pairs for _, pairs, _ in parsed])
    for (role, _, turns), key in zip(parsed, keys, strict=True):
        split = three_way_split(key, SALT)
        if split not in splits:
            continue
        speaker = SPEAKERS[0] if len(turns) % 2 == 1 else SPEAKERS[1]
        other = SPEAKERS[1] if speaker == SPEAKERS[0] else SPEAKERS[0]
        *history, utterance = turns[-BAD_NUM_TURNS:]
        n = len(history)
        yield LabelledExample(
            utterance=utterance.strip(),
            history=tuple(Turn(text.strip(), speaker if (n - i) % 2 == 0 else other) for i, text in enumerate(history)),
            label=LABELS[role],
            source=SOURCE,
            split=split,
            family=FAMILY,
            task=f"{SOURCE}/{speaker}",
            metadata={"speaker": speaker, "dialogue_turns": len(turns)},
        )


def find(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, DIRS), FILES)
    status, note = split_status(found, FILES)
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    records: list[tuple[str, Any]] = []
    for role in FILES:
        path = found.files.get(role)
        if path is None:
            continue
        data = read_json(path)
        if not isinstance(data, list):
            raise DatasetFormatError(path, "expected a JSON list of records", line=1)
        records.extend((role, record) for record in data)
    return examples_from_records(records, dict(found.files), splits)
