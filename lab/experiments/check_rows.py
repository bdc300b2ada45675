"""The int8 check per dialogue (served) against per row: which verdicts, and how many fp32 tokens (issue 53, item 3).

``python -m lab.experiments.check_rows --model models/default --data-dir ../shared/data --split valid --split test``

The served int8 re-scores with fp32 both rows of a dialogue whose main score lies within the card's band of the
threshold (``OnnxClassifier.logits_encoded``, the rule the export's gate judged). The main score is the maximum
of the score heads, and in a decomposed model each head is read from one row: the context heads from the dialogue
row, the others from the utterance-alone row. "Per row" re-scores, of such a dialogue, only the rows whose own
score heads lie within the band. This scores the DiaSafety + ConvAbuse dialogues of each split with the int8
unchecked, the served int8 (its check) and fp32, and prints, per split: the dialogues checked, the fp32 tokens
each rule re-reads, and how often each rule's verdict agrees with fp32's and with the other's. A measurement of a
design, not the service: nothing in the package uses the per-row rule.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.scoring import (
    context_columns,
    decomposed_logits,
    head_probabilities,
    is_offensive,
    main_scores,
    near_thresholds,
)
from lab.bench.dialogues import load_dialogues
from lab.bench.emit import emit_report


def _tokens(rows: Sequence[EncodedExample]) -> int:
    return sum(len(r) for r in rows)


def measure(
    served: OnnxClassifier, unchecked: OnnxClassifier, fp32: OnnxClassifier, encoded: list[EncodedExample]
) -> dict[str, Any]:
    card = served.card
    threshold, band = card.threshold, served.check_band
    context = context_columns(card)
    score_cols = [card.heads.index(h) for h in card.score_heads]
    dialogue_cols = [c for c in score_cols if c in context]  # score heads read from the dialogue row
    alone_cols = [c for c in score_cols if c not in context]  # ... and from the utterance-alone row

    def probs(clf: OnnxClassifier) -> np.ndarray:
        return head_probabilities(decomposed_logits(encoded, clf.row_logits, context), card)

    p8, p32 = probs(unchecked), probs(fp32)
    m8, m32 = main_scores(p8, card), main_scores(p32, card)
    m_served = main_scores(head_probabilities(served.logits_encoded(encoded), card), card)
    near = near_thresholds(m8, [threshold], band)  # the dialogues the served check re-scores
    history = np.array([e.alone is not None for e in encoded], dtype=bool)

    def near_in(cols: list[int]) -> np.ndarray:
        if not cols:
            return np.zeros(len(encoded), dtype=bool)
        return near & near_thresholds(p8[:, cols].max(axis=1), [threshold], band)

    redo_dialogue = np.where(history, near_in(dialogue_cols), near)  # without history: the one row
    redo_alone = history & near_in(alone_cols)
    per_row = p8.copy()
    per_row[np.ix_(redo_dialogue & history, dialogue_cols)] = p32[np.ix_(redo_dialogue & history, dialogue_cols)]
    per_row[np.ix_(redo_alone, alone_cols)] = p32[np.ix_(redo_alone, alone_cols)]
    per_row[~history & near] = p32[~history & near]
    m_row = main_scores(per_row, card)

    def alone_tokens(e: EncodedExample) -> int:
        return _tokens(e.alone.rows) if e.alone is not None else 0

    served_tokens = sum(_tokens(e.rows) + alone_tokens(e) for e, n in zip(encoded, near, strict=True) if n)
    row_tokens = sum(
        (_tokens(e.rows) if d else 0) + (alone_tokens(e) if a else 0)
        for e, d, a in zip(encoded, redo_dialogue, redo_alone, strict=True)
    )
    verdict = {name: is_offensive(m, threshold) for name, m in (("fp32", m32), ("int8", m8), ("served", m_served))}
    verdict["per_row"] = is_offensive(m_row, threshold)
    return {
        "dialogues": len(encoded),
        "with_history": int(history.sum()),
        "threshold": threshold,
        "band": band,
        "checked": int(near.sum()),
        "checked_fraction": round(float(near.mean()), 4) if len(encoded) else 0.0,
        "both_rows_near": int((redo_dialogue & redo_alone).sum()),
        "int8_tokens": sum(_tokens(e.rows) + alone_tokens(e) for e in encoded),
        "fp32_tokens": {"served": served_tokens, "per_row": row_tokens},
        "agreement_with_fp32": {
            name: round(float(np.mean(v == verdict["fp32"])), 5) for name, v in verdict.items() if name != "fp32"
        },
        "per_row_differs_from_served": int((verdict["per_row"] != verdict["served"]).sum()),
    }


def markdown(report: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| split | dialogues (with history) | checked | fp32 tokens: served / per row | int8 tokens | "
        "agreement with fp32: int8 / served / per row | per row ≠ served |",
        "|---|---:|---:|---|---:|---|---:|",
    ]
    for split, r in report.items():
        a, f = r["agreement_with_fp32"], r["fp32_tokens"]
        ratio = f["per_row"] / f["served"] if f["served"] else 0.0
        lines.append(
            f"| {split} | {r['dialogues']} ({r['with_history']}) | {r['checked']} ({r['checked_fraction']:.2%}) "
            f"| {f['served']} / {f['per_row']} ({ratio:.0%}) | {r['int8_tokens']} "
            f"| {a['int8']:.2%} / {a['served']:.2%} / {a['per_row']:.2%} | {r['per_row_differs_from_served']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(
        prog="python -m lab.experiments.check_rows", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--model", type=Path, default=Path("models/default"), help="exported model directory")
    parser.add_argument("--data-dir", default=None, help="data directory with DiaSafety and ConvAbuse")
    parser.add_argument("--split", action="append", default=None, help="valid, test (repeatable; default: valid)")
    parser.add_argument("--limit", type=int, default=100_000, help="dialogues per split at most")
    parser.add_argument("--band", type=float, default=None, help="the check's band (default: the card's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    served = OnnxClassifier(args.model, variant="int8")
    if args.band is not None:
        served.check_band = args.band
    if served.check_band <= 0:
        parser.error(f"{args.model}: the card's int8 has no fp32 check (int8_check_band 0); pass --band")
    unchecked = OnnxClassifier(args.model, variant="int8", int8_check=False)
    fp32 = OnnxClassifier(args.model, variant="fp32")
    report: dict[str, dict[str, Any]] = {}
    for split in args.split or ["valid"]:
        examples, note = load_dialogues(args.data_dir, args.limit, split=split)
        report[split] = {"data": note, **measure(served, unchecked, fp32, served.encode(examples))}
    emit_report(report, markdown(report), args.json)
    return report


if __name__ == "__main__":
    main()
