"""BBF Table 10 on DiaSafety and ConvAbuse: (a) utterance only, (b) history and utterance in one
segment, (c) history and utterance in two segments; mean ± std of test OFFENSIVE-F1 over seeds.

    python -m lab.experiments.ablation --data-dir ../shared/data --out runs/ablation [--seeds 0,1,2]

Writes ``results.json`` (every run's test metrics) and ``table.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from dialogue_safety.sources.data_dir import resolve_data_dir
from dialogue_safety.training.recipe import add_override_argument, load_recipe

MODES = {
    "utterance_only": "(a) utterance only",
    "concat": "(b) history + utterance, one segment",
    "segments": "(c) history + utterance, two segments",
}


def _fmt(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def render_table(results: dict[str, dict[str, list[float]]], tasks: Sequence[str], seeds: int) -> str:
    head = "| input | " + " | ".join(f"{t} test OFFENSIVE-F1" for t in tasks) + " |"
    lines = [head, "|" + "---|" * (len(tasks) + 1)]
    for mode, label in MODES.items():
        if mode in results:
            lines.append(f"| {label} | " + " | ".join(_fmt(results[mode][t]) for t in tasks) + " |")
    lines.append(f"\nmean ± sample std over {seeds} seed(s); threshold tuned on validation per run.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    prog = "python -m lab.experiments.ablation"
    p = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--data-dir", help="dataset directory (default: $DIALOGUE_SAFETY_DATA_DIR or ../shared/data)")
    p.add_argument(
        "--out",
        default="runs/ablation",
        help="output directory: one checkpoint per mode and seed, results.json, table.md (default: %(default)s); "
        "an interrupted ablation resumes from its results.json",
    )
    p.add_argument("--recipe", default="ablation", help="recipe name in recipes/ or a TOML path (default: %(default)s)")
    p.add_argument(
        "--seeds", default="0,1,2", help="comma-separated seeds, one run per mode each (default: %(default)s)"
    )
    p.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated input modes (encoding.context_mode), from {', '.join(MODES)} (default: all)",
    )
    add_override_argument(p, "override a recipe value for every run, e.g. --set epochs=2")
    args = p.parse_args(argv)
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        print(f"{prog}: unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}", file=sys.stderr)
        return 2
    try:
        data_dir = resolve_data_dir(args.data_dir)
        seeds = [int(s) for s in args.seeds.split(",")]
    except (FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    try:
        from dialogue_safety.training.trainer import train  # torch is imported only now
    except ModuleNotFoundError as exc:
        from dialogue_safety.extras import install_hint

        print(f"{prog}: the Python module {exc.name!r} is not installed; {install_hint('train')}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    runs: dict[str, dict] = json.loads(results_path.read_text()) if results_path.exists() else {}
    for mode in args.modes.split(","):
        for seed in seeds:
            key = f"{mode}/seed{seed}"
            if key in runs:  # finished earlier: an interrupted ablation picks up where it stopped
                continue
            recipe = load_recipe(args.recipe, [*args.overrides, f"seed={seed}", f"encoding.context_mode={mode}"])
            result = train(recipe, data_dir, out / mode / f"seed{seed}")
            runs[key] = {
                "test": {t: m["all"] for t, m in result.card.metrics["test"].items()},
                "threshold": result.card.threshold,
                "seconds": result.seconds,
            }
            results_path.write_text(json.dumps(runs, indent=2))
    tasks = sorted({t for r in runs.values() for t in r["test"]})
    table: dict[str, dict[str, list[float]]] = {}
    for key, run in runs.items():
        mode = key.split("/")[0]
        for t in tasks:
            table.setdefault(mode, {}).setdefault(t, []).append(run["test"][t]["offensive_f1"])
    text = render_table(table, tasks, len(seeds))
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
