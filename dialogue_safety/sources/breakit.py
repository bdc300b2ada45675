"""Break-it rounds: the validated attacks of the build it / break it / fix it loop as a training source.

This module owns the format: its layout, file names and records, and :func:`find` / :func:`load`
read it (registered as the ``breakit`` source); :func:`dialogue_safety.breakit.export.export_round`
writes it from the game's store (``dialogue-safety break-it export``). Every round found
is loaded; the round is kept (``LabelledExample.round``: ``"1"``, ``"2"``...), the task is
``breakit``, the family OFFENSIVE (an attack targets the served offensive score).

Layout under a data directory::

    breakit/round-<N>/train.jsonl, valid.jsonl, test.jsonl   (always all three, maybe empty)
    breakit/round-<N>/round.json                              (what was exported, and what was left out)

One JSON object per line::

    {"id": "r1-a17", "round": 1, "kind": "attack" | "contrast",
     "history": [{"speaker": "user" | null, "text": "..."}], "utterance": "...",
     "label": "OFFENSIVE" | "SAFE", "mode": "offensive" | "safe",
     "attacker": "<pseudonymous player id>", "attack_id": 17,
     "scores": {"<model under attack>": 0.21, "A0": 0.64},
     "validation": {"confirms": 2, "rejects": 0, "flags": 0}}

What is exported: each attack that fooled the model and was validated (more confirmations than
rejections, at least one), with its intended label; attacks a validator flagged are left out
(listed in ``round.json`` for review). A validator's contrast example (a minimal edit that flips
the label) is a ``contrast`` record with the opposite label, in the same split as its attack.
Splits are by attacker, so that no attacker is on both sides: attackers are ordered by a stable
hash of their id and the round number; with three or more, at least one goes to valid and one
to test (about 10% each), the rest to train (:func:`dialogue_safety.breakit.export.assign_splits`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_jsonl
from dialogue_safety.sources.layout import SourceFiles, Status

SOURCE = "breakit"
BREAKIT_DIR = "breakit"
ROUND_FILE = "round.json"
SPLIT_FILES: dict[Split, str] = {Split.TRAIN: "train.jsonl", Split.VALID: "valid.jsonl", Split.TEST: "test.jsonl"}
KINDS = ("attack", "contrast")


def round_dir(root: Path, number: int) -> Path:
    """``<root>/breakit/round-<N>``: ``root`` is a data directory."""
    return root / BREAKIT_DIR / f"round-{number}"


def round_number(directory: Path) -> int | None:
    name = directory.name
    if not name.startswith("round-") or not name.removeprefix("round-").isdigit():
        return None
    return int(name.removeprefix("round-"))


@dataclass(frozen=True)
class BreakItRecord:
    """One parsed line (the loader turns it into a LabelledExample)."""

    id: str
    round: int
    kind: str
    history: tuple[Turn, ...]
    utterance: str
    label: Label
    metadata: Mapping[str, Any]


def parse_record(obj: Any, error: Callable[[str], Exception]) -> BreakItRecord:
    """Check one record; ``error(problem)`` builds the exception that names file and line."""
    if not isinstance(obj, dict):
        raise error(f"expected a JSON object, found {type(obj).__name__}")
    for key in ("id", "round", "kind", "utterance", "label"):
        if key not in obj:
            raise error(f"missing {key!r}")
    utterance = obj["utterance"]
    if not isinstance(utterance, str) or not utterance.strip():
        raise error("empty or missing 'utterance'")
    try:
        label = Label(obj["label"])
    except ValueError:
        raise error(f"unknown label {obj['label']!r} (expected OFFENSIVE or SAFE)") from None
    if obj["kind"] not in KINDS:
        raise error(f"unknown kind {obj['kind']!r} (expected one of {', '.join(KINDS)})")
    if not isinstance(obj["round"], int):
        raise error(f"'round' must be an integer, found {obj['round']!r}")
    history = obj.get("history", [])
    if not isinstance(history, list):
        raise error("'history' must be a list of turns")
    turns = []
    for i, turn in enumerate(history):
        if isinstance(turn, str):
            turns.append(Turn(turn))
        elif isinstance(turn, dict) and isinstance(turn.get("text"), str) and turn["text"].strip():
            speaker = turn.get("speaker")
            turns.append(Turn(turn["text"], None if speaker is None else str(speaker)))
        else:
            raise error(f"history[{i}] must be a string or an object with a non-empty 'text'")
    metadata = {k: obj[k] for k in ("mode", "attacker", "attack_id", "scores", "validation") if k in obj}
    metadata = {"kind": obj["kind"], "id": obj["id"], **metadata}
    return BreakItRecord(str(obj["id"]), obj["round"], obj["kind"], tuple(turns), utterance, label, metadata)


def find(data_dir: Path) -> SourceFiles:
    root = data_dir / BREAKIT_DIR
    if not root.is_dir():
        return SourceFiles.missing()
    rounds = sorted((n, d) for d in root.iterdir() if d.is_dir() and (n := round_number(d)) is not None)
    files: dict[str, Path] = {}
    gaps = []
    for n, folder in rounds:
        for split, name in SPLIT_FILES.items():
            if (folder / name).is_file():
                files[f"round-{n}/{split.value}"] = folder / name
            else:
                gaps.append(f"round-{n}/{name}")
    if not files:
        return SourceFiles.missing()
    note = f"rounds {', '.join(str(n) for n, _ in rounds)}" + (f"; missing {', '.join(gaps)}" if gaps else "")
    return SourceFiles(Status.PARTIAL if gaps else Status.COMPLETE, files, note)


def read_file(path: Path, split: Split) -> Iterator[LabelledExample]:
    folder_round = round_number(path.parent)
    for line, obj in read_jsonl(path):

        def error(problem: str, line: int = line) -> DatasetFormatError:
            return DatasetFormatError(path, problem, line=line)

        record = parse_record(obj, error)
        if folder_round is not None and record.round != folder_round:
            raise error(f"round {record.round} in the folder of round {folder_round}")
        yield LabelledExample(
            utterance=record.utterance,
            history=record.history,
            label=record.label,
            source=SOURCE,
            split=split,
            family=LabelFamily.OFFENSIVE,
            task=SOURCE,
            round=str(record.round),
            metadata={**record.metadata, "line": line},
        )


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    for role, path in found.files.items():
        split = Split(role.rsplit("/", 1)[1])
        if split in splits:
            yield from read_file(path, split)
