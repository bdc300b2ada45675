"""``dialogue-safety train --config RECIPE [--data-dir DIR] [--out DIR] [--set key=value ...]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from dialogue_safety.sources.data_dir import resolve_data_dir
from dialogue_safety.training.recipe import Recipe, add_override_argument, load_recipe


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Train a dialogue safety classifier from a recipe.")
    p.add_argument(
        "--config", required=True, help="recipe name in recipes/ (tiny, default, bert-base, ...) or a TOML path"
    )
    p.add_argument("--data-dir", help="dataset directory (default: $DIALOGUE_SAFETY_DATA_DIR or ../shared/data)")
    p.add_argument("--out", help="output checkpoint directory (default: checkpoints/<recipe>)")
    add_override_argument(
        p,
        "override a recipe value, e.g. --set epochs=3 --set tasks.diasafety.weight=2 "
        "--set encoding.context_mode=concat",
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/last if a run was interrupted")
    p.add_argument(
        "--force", action="store_true", help="train from the start over a finished or interrupted run in OUT (lost)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety train") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        recipe = load_recipe(args.config, args.overrides)
        data_dir = resolve_data_dir(args.data_dir)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from dialogue_safety.training.tasks import DataError
    from dialogue_safety.training.trainer import train  # torch is imported only now

    out = Path(args.out or Path("checkpoints") / recipe.name)
    problem = _run_in_the_way(out, resume=args.resume, force=args.force) or _recipe_problem(recipe)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        result = train(recipe, data_dir, out, resume=args.resume, progress=not args.no_progress)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = {
        "checkpoint": str(result.out_dir),
        "steps": result.steps,
        "seconds": round(result.seconds, 1),
        "threshold": result.card.threshold,
        "temperatures": result.card.temperatures,
        "test_offensive_f1": {
            name: round(m["all"]["offensive_f1"], 2) for name, m in result.card.metrics.get("test", {}).items()
        },
        "test_accuracy": {
            name: round(m["all"]["accuracy"], 2) for name, m in result.card.metrics.get("test", {}).items()
        },
    }
    print(json.dumps(summary, indent=2))
    return 0


def _run_in_the_way(out: Path, *, resume: bool, force: bool) -> str | None:
    """Why training into ``out`` would lose a run (a finished checkpoint; an interrupted one, unless resumed), or
    None. Hours of work are not replaced without ``--force``."""
    from dialogue_safety.core.model_dir import is_checkpoint
    from dialogue_safety.training.run_dir import LAST_DIR, has_state

    if force:
        return None
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a directory"
    if is_checkpoint(out):
        return f"{out} holds a finished run; choose another --out, or pass --force to train over it"
    if has_state(out / LAST_DIR) and not resume:
        return f"{out} holds an interrupted run; pass --resume to continue it, or --force to start over"
    return None


def _recipe_problem(recipe: Recipe) -> str | None:
    """What in the recipe names something that is not there (a source, a checkpoint to start from, a vocabulary
    file), found before the run starts rather than as a traceback inside it; None if nothing."""
    from dialogue_safety.core.model_dir import is_checkpoint
    from dialogue_safety.sources.registry import source_names

    known = set(source_names())
    unknown = sorted({t.source for t in recipe.tasks} - known)
    if unknown:
        return f"unknown source(s) {unknown} in the recipe's tasks; known: {', '.join(sorted(known))}"
    if recipe.init_from and not is_checkpoint(recipe.init_from):
        return f"init_from {recipe.init_from} is not a training checkpoint"
    if recipe.vocab_file and not Path(recipe.vocab_file).is_file():
        return f"vocab_file {recipe.vocab_file} is not a file"
    return None
