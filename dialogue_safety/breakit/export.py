"""Export a round: the validated attacks of the game's store, written as the ``breakit`` dataset source.

``dialogue-safety break-it export --round N OUT`` writes ``OUT/breakit/round-N/`` in the format that
:mod:`dialogue_safety.sources.breakit` owns and reads (what is exported, what is left out, how the
splits are drawn: see there and docs/breakit.md). Fix-it then trains on it like on any source.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dialogue_safety.core.schema import Label, Split
from dialogue_safety.sources.breakit import ROUND_FILE, SPLIT_FILES, round_dir
from dialogue_safety.sources.splitting import stable_fraction

if TYPE_CHECKING:
    from dialogue_safety.breakit.store import BreakItStore

VALID_SHARE = TEST_SHARE = 0.1


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
