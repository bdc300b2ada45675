"""Break-it rounds: the validated attacks of the build it / break it / fix it loop as a training source.

This module owns the format: :func:`export_round` writes it (``dialogue-safety break-it export``),
:func:`find` / :func:`load` read it (registered as the ``breakit`` source). Every round found
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
to test (about 10% each), the rest to train.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_jsonl
from dialogue_safety.sources.layout import SourceFiles, Status
from dialogue_safety.sources.splitting import stable_fraction

if TYPE_CHECKING:
    from dialogue_safety.breakit.store import BreakItStore

SOURCE = "breakit"
BREAKIT_DIR = "breakit"
ROUND_FILE = "round.json"
SPLIT_FILES: dict[Split, str] = {Split.TRAIN: "train.jsonl", Split.VALID: "valid.jsonl", Split.TEST: "test.jsonl"}
KINDS = ("attack", "contrast")
VALID_SHARE = TEST_SHARE = 0.1


def round_dir(root: Path, number: int) -> Path:
    """``<root>/breakit/round-<N>``: ``root`` is a data directory."""
    return root / BREAKIT_DIR / f"round-{number}"


def round_number(directory: Path) -> int | None:
    name = directory.name
    if not name.startswith("round-") or not name.removeprefix("round-").isdigit():
        return None
    return int(name.removeprefix("round-"))


def assign_splits(attackers: Iterable[str], number: int) -> dict[str, Split]:
    """Each attacker's split: all of an attacker's examples land on one side."""
    ordered = sorted(set(attackers), key=lambda a: (stable_fraction(a, f"breakit-round-{number}"), a))
    n = len(ordered)
    n_test = max(1, math.floor(n * TEST_SHARE + 0.5)) if n >= 3 else 0
    n_valid = max(1, math.floor(n * VALID_SHARE + 0.5)) if n >= 3 else 0
    out = {}
    for i, attacker in enumerate(ordered):
        out[attacker] = Split.TEST if i < n_test else Split.VALID if i < n_test + n_valid else Split.TRAIN
    return out


@dataclass
class ExportSummary:
    round: int
    out_dir: Path
    examples: dict[str, int] = field(default_factory=dict)  # split -> records
    attackers: dict[str, int] = field(default_factory=dict)  # split -> attackers
    contrasts: int = 0
    left_out: dict[str, list[int]] = field(default_factory=dict)  # reason -> attack ids

    def as_json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "out_dir": str(self.out_dir),
            "examples": self.examples,
            "attackers": self.attackers,
            "contrasts": self.contrasts,
            "left_out": self.left_out,
        }


def export_round(store: BreakItStore, number: int, root: Path) -> ExportSummary:
    """Write round ``number``'s validated attacks under ``root`` (a data directory); returns what was written."""
    rnd = store.round(number)
    judged = store.judged_attacks(number)
    summary = ExportSummary(number, round_dir(root, number))
    summary.left_out = {"not_validated": [], "flagged": []}
    kept = []
    for j in judged:
        if j.flags:
            summary.left_out["flagged"].append(j.attack.id)
        elif not j.validated:
            summary.left_out["not_validated"].append(j.attack.id)
        else:
            kept.append(j)
    splits = assign_splits((j.attack.player_id for j in kept), number)
    records: dict[Split, list[dict[str, Any]]] = {s: [] for s in SPLIT_FILES}
    for j in kept:
        a = j.attack
        intended = Label(a.intended_label)
        base = {
            "round": number,
            "history": a.history,
            "mode": "offensive" if intended is Label.OFFENSIVE else "safe",
            "attacker": a.player_id,
            "attack_id": a.id,
            "scores": {a.model_id: a.score, **a.reference_scores},
            "validation": {"confirms": j.confirms, "rejects": j.rejects, "flags": j.flags},
        }
        split = splits[a.player_id]
        records[split].append(
            {"id": f"r{number}-a{a.id}", "kind": "attack", "utterance": a.text, "label": intended.value, **base}
        )
        for k, contrast in enumerate(j.contrasts):
            flipped = Label.SAFE if intended is Label.OFFENSIVE else Label.OFFENSIVE
            records[split].append(
                {
                    "id": f"r{number}-a{a.id}-c{k}",
                    "kind": "contrast",
                    "utterance": contrast,
                    "label": flipped.value,
                    **base,
                }
            )
            summary.contrasts += 1
    out = summary.out_dir
    out.mkdir(parents=True, exist_ok=True)
    for split, name in SPLIT_FILES.items():
        tmp = out / f".{name}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            for record in records[split]:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        tmp.replace(out / name)  # a reader never sees a half-written split
        summary.examples[split.value] = len(records[split])
        summary.attackers[split.value] = sum(1 for s in splits.values() if s is split)
    board = store.scoreboard(number)
    tries, fooled = sum(r["tries"] for r in board), sum(r["fooled"] for r in board)
    meta = {
        **summary.as_json(),
        "game": {
            "tries": tries,
            "fooled": fooled,
            "attack_success_rate": round(100.0 * fooled / tries, 2) if tries else None,
        },
        "model": rnd.model_id,
        "references": rnd.references,
        "exported_at": datetime.now(UTC).isoformat(),
        "format": "see dialogue_safety/sources/breakit.py and docs/breakit.md",
    }
    (out / ROUND_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return summary


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


# -- the context pool the game draws from ----------------------------------------------------------
POOL_SOURCES = ("diasafety", "convabuse", "bbf_multi_turn", "bad")  # sources with real dialogue history


def safe_contexts(
    names: Iterable[str], data_dir: Path | str | None, size: int, seed: int = 0
) -> list[list[dict[str, str | None]]]:
    """Up to ``size`` safe conversations (turns, oldest first) from the train splits of ``names``: a SAFE
    example with at least one history turn, its utterance appended as the last turn. Sampled
    with ``seed``, deduplicated."""
    import random

    from dialogue_safety.sources.registry import load_source

    seen: set[tuple[str, ...]] = set()
    pool: list[list[dict[str, str | None]]] = []
    for name in names:
        for ex in load_source(name, data_dir, splits=[Split.TRAIN]):
            if ex.label is not Label.SAFE or not ex.history or not ex.utterance.strip():
                continue
            if any(not t.text.strip() for t in ex.history):
                continue
            reply_speaker = {"user": "bot", "bot": "user", "agent": "user"}.get(ex.history[-1].speaker or "")
            turns = [*ex.history, Turn(ex.utterance, reply_speaker)]
            key = tuple(t.text for t in turns)
            if key not in seen:
                seen.add(key)
                pool.append([{"speaker": t.speaker, "text": t.text} for t in turns])
    random.Random(seed).shuffle(pool)
    return pool[:size]


def read_pool(path: Path) -> list[list[dict[str, str | None]]]:
    """A pool file: JSON lines, each a list of turns (strings or ``{"speaker", "text"}``) or ``{"turns": [...]}``."""
    pool = []
    for line, obj in read_jsonl(path):
        turns = obj.get("turns") if isinstance(obj, dict) else obj
        if not isinstance(turns, list) or not turns:
            raise DatasetFormatError(path, 'expected a non-empty list of turns (or {"turns": [...]})', line=line)
        context = []
        for i, turn in enumerate(turns):
            if isinstance(turn, str) and turn.strip():
                context.append({"speaker": None, "text": turn})
            elif isinstance(turn, dict) and isinstance(turn.get("text"), str) and turn["text"].strip():
                speaker = turn.get("speaker")
                context.append({"speaker": None if speaker is None else str(speaker), "text": turn["text"]})
            else:
                raise DatasetFormatError(
                    path, f"turn {i} must be a non-empty string or have a non-empty 'text'", line=line
                )
        pool.append(context)
    return pool
