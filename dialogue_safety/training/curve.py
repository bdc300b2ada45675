"""The training curve of a run, read from its ``metrics.jsonl`` (what the model card and the plots show).

A run resumed across sessions writes one ``start`` event per leg and may repeat the steps after its
last checkpoint; the curve keeps the last record of each step. Its time is the sum of the legs' wall
times (each leg's ``elapsed_s`` counts from that leg's start, data loading included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: the training loss kept every this many steps (the card stays small; the log has every ``log_every``)
LOSS_EVERY = 100


def read_curve(metrics_path: Path, loss_every: int = LOSS_EVERY) -> dict[str, Any]:
    """``{"valid": [{step, epoch, macro_f1, threshold, offensive_f1}], "loss": [[step, loss]], "legs",
    "train_seconds"}`` from a run's metrics log; a line that is not JSON is an error naming file and line."""
    valid: dict[int, dict[str, Any]] = {}
    loss: dict[int, float] = {}
    legs: list[float] = []
    with metrics_path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{metrics_path}:{number}: not a JSON line ({exc.msg})") from exc
            kind = event.get("event")
            if kind == "start":
                legs.append(0.0)
            elif kind == "train":
                if not legs:
                    legs.append(0.0)
                legs[-1] = max(legs[-1], float(event.get("elapsed_s", 0.0)))
                if event["step"] % loss_every == 0:
                    loss[int(event["step"])] = round(float(event["loss"]), 4)
            elif kind == "valid":
                valid[int(event["step"])] = {
                    "step": int(event["step"]),
                    "epoch": event.get("epoch"),
                    "macro_f1": round(float(event["macro_f1"]), 2),
                    "threshold": event.get("threshold"),
                    "offensive_f1": {k: round(float(v), 2) for k, v in (event.get("offensive_f1") or {}).items()},
                }
    return {
        "valid": [valid[s] for s in sorted(valid)],
        "loss": [[s, loss[s]] for s in sorted(loss)],
        "legs": len(legs),
        "train_seconds": round(sum(legs), 1),
    }


def curve_table(curve: dict[str, Any], tasks: list[str] | None = None) -> list[str]:
    """The validation checks as a Markdown table: step, epoch, training loss there, macro F1, per task."""
    checks = curve.get("valid") or []
    if not checks:
        return []
    tasks = tasks or sorted({t for c in checks for t in c["offensive_f1"]})
    loss = dict((int(s), v) for s, v in curve.get("loss") or [])
    lines = [
        "| step | epoch | loss | macro F1 | " + " | ".join(tasks) + " |",
        "|---:|---:|---:|---:|" + "---:|" * len(tasks),
    ]
    for c in checks:
        cells = [f"{c['offensive_f1'][t]:.1f}" if t in c["offensive_f1"] else "—" for t in tasks]
        at = loss.get(c["step"])
        lines.append(
            f"| {c['step']:,} | {c['epoch'] if c['epoch'] is not None else '—'} | "
            f"{'—' if at is None else f'{at:.3f}'} | {c['macro_f1']:.1f} | " + " | ".join(cells) + " |"
        )
    return lines
