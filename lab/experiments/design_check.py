"""Compare head designs on validation under both label semantics.

``python -m lab.experiments.design_check CKPT [CKPT ...] --data-dir DIR [--json OUT]`` scores every
checkpoint's served OFFENSIVE score on the validation splits of the *first* checkpoint's recipe
(the same examples for all) and reports, per source and as the macro mean over sources, the
OFFENSIVE-F1 at the threshold that maximises that mean:

* ``source labels``: each dataset's own label (hate datasets: *hateful*), and
* ``harmonised``: the served definition (:mod:`dialogue_safety.training.harmonise`): hate-dataset negatives that
  the abuse teacher (fitted on the recipe's offensive-family training texts) calls abusive have
  no served label and are left out.

Only validation splits are read, so this is how a head design is chosen; test splits are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.model_dir import is_checkpoint
from dialogue_safety.sources.data_dir import resolve_data_dir
from dialogue_safety.training.harmonise import HARMONISED
from dialogue_safety.training.heads import head_names, label_rules
from dialogue_safety.training.inference import TorchClassifier
from dialogue_safety.training.recipe import recipe_from_dict
from dialogue_safety.training.tasks import load_task_data
from dialogue_safety.training.validation import score_valid_sets


def compare(checkpoints: Sequence[Path], data_dir: Path) -> dict[str, Any]:
    first = TorchClassifier(checkpoints[0])
    recipe = recipe_from_dict(first.card.training["recipe"])
    tasks, _ = load_task_data(recipe, data_dir)
    harmonised = dataclasses.replace(recipe, heads=HARMONISED)
    rules = label_rules(harmonised, head_names(harmonised, tasks), [e for t in tasks for e in t.train])
    out: dict[str, Any] = {"checkpoints": {}}
    for path in checkpoints:
        clf = first if path == checkpoints[0] else TorchClassifier(path)
        semantics: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {"source labels": {}, "harmonised": {}}
        for t in tasks:
            if not t.valid:
                continue
            scores = clf.predict_proba(t.valid)
            semantics["source labels"][t.spec.name] = (np.array([int(e.label.is_positive) for e in t.valid]), scores)
            gold, keep = rules.served_gold(t.valid)
            semantics["harmonised"][t.spec.name] = (gold[keep], scores[keep])
        entry: dict[str, Any] = {"model": clf.card.model_id, "heads": clf.card.heads, "served": clf.card.score_heads}
        for name, sets in semantics.items():
            check = score_valid_sets(sets)
            entry[name] = {
                "threshold": check["threshold"],
                "macro_f1": check["macro_f1"],
                "per_source": check["offensive_f1"],
            }
        out["checkpoints"][str(path)] = entry
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.experiments.design_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "checkpoints", nargs="+", type=Path, help="training checkpoints (the first one's recipe gives the data)"
    )
    parser.add_argument(
        "--data-dir", default=None, help="datasets (default: $DIALOGUE_SAFETY_DATA_DIR or ../shared/data)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    for path in args.checkpoints:
        if not is_checkpoint(path):
            parser.error(f"{path} is not a training checkpoint (no config.json); train one with dialogue-safety train")
    result = compare(args.checkpoints, resolve_data_dir(args.data_dir))
    for path, entry in result["checkpoints"].items():
        print(f"{path} ({entry['model']}, heads {','.join(entry['heads'])}, served {','.join(entry['served'])})")
        for name in ("source labels", "harmonised"):
            e = entry[name]
            cells = " ".join(f"{k} {v:.1f}" for k, v in e["per_source"].items())
            print(f"  {name:14s} macro {e['macro_f1']:.2f} @ {e['threshold']:.2f}: {cells}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
