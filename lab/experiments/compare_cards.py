"""Two models' card metrics side by side: ``python -m lab.experiments.compare_cards CANDIDATE BASELINE``.

Reads the card (``CARD_FILE``) of two exported models or training checkpoints and prints, per test and validation
set, OFFENSIVE-F1, recall and PR-AUC of each (the trainer's fp32 evaluation at each card's own threshold) and the
F1 difference, marking drops of more than one point (issue 52's rule for the standard sets). A first look before
judging a candidate through the runtime (``dialogue-safety evaluate CANDIDATE --compare BASELINE``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dialogue_safety.core.model_dir import CARD_FILE


def rows(candidate: dict, baseline: dict, split: str) -> list[str]:
    out = []
    for name, metrics in candidate[split].items():
        x, y = metrics.get("all", {}), baseline[split].get(name, {}).get("all", {})
        if x.get("offensive_f1") is None or y.get("offensive_f1") is None or not x.get("positives"):
            continue
        diff = x["offensive_f1"] - y["offensive_f1"]
        mark = " **below**" if diff < -1 else ""
        out.append(
            f"| {name} | {x['offensive_f1']:.1f} / {y['offensive_f1']:.1f} | {diff:+.1f}{mark} "
            f"| {x['recall']:.1f} / {y['recall']:.1f} | {x.get('pr_auc') or 0:.3f} / {y.get('pr_auc') or 0:.3f} |"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("candidate", type=Path)
    parser.add_argument("baseline", type=Path)
    args = parser.parse_args(argv)
    cards = [json.loads((d / CARD_FILE).read_text()) for d in (args.candidate, args.baseline)]
    print(f"thresholds: {cards[0]['threshold']} / {cards[1]['threshold']}")
    for split in ("test", "valid"):
        print(f"\n{split}: candidate / baseline\n")
        print("| set | OFFENSIVE-F1 | Δ | recall | PR-AUC |\n|---|---|---:|---|---|")
        print("\n".join(rows(cards[0]["metrics"], cards[1]["metrics"], split)))


if __name__ == "__main__":
    main()
