"""``dialogue-safety fix-it --round N``: train A(N) on the recipe plus every validated round, export it,
and judge every model of the loop on every round's test split (BBF Table 6).

Steps (everything under ``--out``, default ``runs/fix-it/round-N``):

1. ``data/``: the data directory the recipe trains on: links to every entry of ``--data-dir``,
   with ``breakit/`` holding the rounds 1..N exported under ``--rounds-dir`` (default: the data
   directory itself): ``dialogue-safety break-it export --round K DIR`` writes them.
2. ``checkpoint/``: the recipe plus a ``breakit`` task restricted to rounds 1..N, later rounds
   upsampled (round k weighs ``k``, as Dynabench upsamples its newest rounds); the version is
   ``<recipe version>+r<N>``.
3. ``model/``: the checkpoint exported to ONNX (fp32, parity-checked): ready to hot-swap.
4. ``report.json`` / ``report.md``: every model of the loop (``--model A0=DIR``... for the earlier
   ones, then A(N)) on every round's test split: error rate (% misclassified) and OFFENSIVE-F1,
   one row per model, one column per round; and per round the attack success rate the players
   reached against the model under attack in the game (``round.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import Label, LabelledExample, Split
from dialogue_safety.sources.breakit import BREAKIT_DIR, ROUND_FILE, SOURCE, round_dir
from dialogue_safety.training.recipe import Recipe, TaskSpec, add_override_argument, load_recipe

DEFAULT_OUT = Path("runs") / "fix-it"


def merged_data_dir(data_dir: Path, rounds_dir: Path, number: int, out: Path) -> Path:
    """``out``: links to ``data_dir``'s entries, and ``breakit/round-K`` (K <= number) from ``rounds_dir``."""
    out.mkdir(parents=True, exist_ok=True)
    for entry in data_dir.iterdir():
        link = out / entry.name
        if entry.name == BREAKIT_DIR or link.exists() or link.is_symlink():
            continue
        link.symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    breakit = out / BREAKIT_DIR
    breakit.mkdir(exist_ok=True)
    found = []
    for k in range(1, number + 1):
        source = round_dir(rounds_dir, k)
        if not source.is_dir():
            continue
        link = breakit / source.name
        if not link.exists():
            link.symlink_to(source.resolve(), target_is_directory=True)
        found.append(k)
    if number not in found:
        raise FileNotFoundError(
            f"round {number} is not exported under {rounds_dir}: run 'dialogue-safety break-it export --round {number} "
            f"{rounds_dir}' first"
        )
    return out


def fix_it_recipe(recipe: Recipe, rounds: Sequence[int], number: int) -> Recipe:
    """The recipe plus the break-it rounds, round k upsampled by k."""
    spec = TaskSpec(
        source=SOURCE,
        rounds=tuple(str(k) for k in rounds),
        round_weights={str(k): float(k) for k in rounds},
        required=True,
    )
    tasks = tuple(t for t in recipe.tasks if t.source != SOURCE) + (spec,)
    return dataclasses.replace(
        recipe, tasks=tasks, version=f"{recipe.version}+r{number}", name=f"{recipe.name}-fixit-r{number}"
    )


def round_matrix(
    models: Mapping[str, Path], tests: Mapping[int, Sequence[LabelledExample]]
) -> dict[str, dict[int, dict[str, Any]]]:
    """Every model on every round's test split: n, error rate (% misclassified), OFFENSIVE-F1."""
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.training.metrics import binary_metrics

    out: dict[str, dict[int, dict[str, Any]]] = {}
    for role, directory in models.items():
        classifier = OnnxClassifier(directory)
        out[role] = {}
        for k, examples in sorted(tests.items()):
            if not examples:
                out[role][k] = {"n": 0, "error_rate": None, "offensive_f1": None}
                continue
            predictions = classifier.predict([e.as_example() for e in examples])
            wrong = sum(p.label is not e.label for p, e in zip(predictions, examples, strict=True))
            gold = [int(e.label is Label.OFFENSIVE) for e in examples]
            m = binary_metrics(gold, [p.score for p in predictions], classifier.card.threshold)
            out[role][k] = {
                "n": len(examples),
                "error_rate": 100.0 * wrong / len(examples),
                "offensive_f1": m["offensive_f1"],
            }
    return out


def standard_test(models: Mapping[str, Path]) -> dict[str, dict[str, float]]:
    """Each model's OFFENSIVE-F1 per standard test set, as its card records it (written at training time)."""
    from dialogue_safety.core.model_card import ModelCard

    out = {}
    for role, directory in models.items():
        test = ModelCard.load(directory).metrics.get("test", {})
        out[role] = {task: float(m["all"]["offensive_f1"]) for task, m in test.items() if "all" in m}
    return out


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def markdown_report(report: Mapping[str, Any]) -> str:
    rounds = [int(k) for k in report["rounds"]]
    lines = [f"# Fix-it round {report['round']}: {report['model']}", ""]
    for metric, title in (("error_rate", "Error rate (% misclassified)"), ("offensive_f1", "OFFENSIVE-F1")):
        lines += [f"## {title} on each round's test split (BBF Table 6)", ""]
        lines += ["| model | " + " | ".join(f"round {k} (n={report['test_sizes'][str(k)]})" for k in rounds) + " |"]
        lines += ["|---|" + "---|" * len(rounds)]
        for role, row in report["matrix"].items():
            lines += [f"| {role} | " + " | ".join(_cell(row[str(k)][metric]) for k in rounds) + " |"]
        lines += [""]
    lines += [
        "## The game: attacks that fooled the model under attack",
        "",
        "| round | model under attack | tries | fooled | attack success rate |",
        "|---|---|---|---|---|",
    ]
    for k in rounds:
        game = report["game"].get(str(k)) or {}
        lines += [
            f"| {k} | {game.get('model', '–')} | {game.get('tries', '–')} | {game.get('fooled', '–')} | "
            f"{_cell(game.get('attack_success_rate'))} |"
        ]
    tasks = sorted({t for row in report["standard_test"].values() for t in row if t != SOURCE})
    if tasks:
        lines += ["", "## OFFENSIVE-F1 on the standard test sets (from each model's card)", ""]
        lines += ["| model | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for role, row in report["standard_test"].items():
            lines += [f"| {role} | " + " | ".join(_cell(row.get(t)) for t in tasks) + " |"]
    lines += [
        "",
        f"Trained with recipe `{report['recipe']}` on `{report['data_dir']}`; reproduce with:",
        "",
        f"    {report['command']}",
        "",
    ]
    return "\n".join(lines)


def fix_it(
    number: int,
    recipe_name: str,
    data_dir: Path,
    rounds_dir: Path,
    out: Path,
    models: Mapping[str, Path],
    overrides: Sequence[str] = (),
    command: str = "",
    progress: bool = True,
) -> dict[str, Any]:
    from dialogue_safety.export.onnx_export import export_checkpoint
    from dialogue_safety.sources.registry import load_source
    from dialogue_safety.training.trainer import train

    data = merged_data_dir(data_dir, rounds_dir, number, out / "data")
    rounds = sorted(k for k in range(1, number + 1) if round_dir(data, k).is_dir())
    recipe = fix_it_recipe(load_recipe(recipe_name, list(overrides)), rounds, number)
    result = train(recipe, data, out / "checkpoint", progress=progress)
    exported = export_checkpoint(result.out_dir, out / "model", variant_names=("fp32",))
    new_role = f"A{number}"
    loop = {**models, new_role: exported.out_dir}
    tests: dict[int, list[LabelledExample]] = {k: [] for k in rounds}
    for ex in load_source(SOURCE, data, splits=[Split.TEST]):
        if ex.round is not None and int(ex.round) in tests:
            tests[int(ex.round)].append(ex)
    matrix = round_matrix(loop, tests)
    game = {}
    for k in rounds:
        meta_path = round_dir(data, k) / ROUND_FILE
        if meta_path.is_file():
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            game[str(k)] = {"model": meta.get("model"), **(meta.get("game") or {})}
    report = {
        "round": number,
        "model": result.card.model_id,
        "model_dir": str(exported.out_dir),
        "recipe": recipe_name,
        "data_dir": str(data_dir),
        "rounds": rounds,
        "test_sizes": {str(k): len(v) for k, v in tests.items()},
        "matrix": {role: {str(k): cell for k, cell in row.items()} for role, row in matrix.items()},
        "game": game,
        "standard_test": standard_test(loop),
        "command": command,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown_report(report), encoding="utf-8")
    return report


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Train A(N) on the recipe plus the validated break-it rounds.")
    p.add_argument("--round", type=int, required=True, dest="number", help="the round N just played (exported)")
    p.add_argument("--config", default="default", help="recipe name or TOML path (default: default; tests: tiny)")
    p.add_argument("--data-dir", help="the data directory (default: $DIALOGUE_SAFETY_DATA_DIR or ../shared/data)")
    p.add_argument("--rounds-dir", type=Path, help="where 'break-it export' wrote the rounds (default: --data-dir)")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="ROLE=DIR",
        help="an earlier model of the loop to judge, e.g. A0=models/default (repeatable, in loop order)",
    )
    p.add_argument("--out", type=Path, help=f"output folder (default: {DEFAULT_OUT}/round-N)")
    add_override_argument(p, "override a recipe value (as in 'dialogue-safety train')")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety fix-it") -> int:
    from dialogue_safety.sources.data_dir import resolve_data_dir
    from dialogue_safety.sources.errors import DatasetFormatError, SourceUnavailableError
    from dialogue_safety.training.tasks import DataError

    args = build_parser(prog).parse_args(argv)
    models: dict[str, Path] = {}
    for item in args.model:
        role, sep, directory = item.partition("=")
        if not sep or not role or not Path(directory).is_dir():
            print(f"{prog}: --model {item!r}: expected ROLE=DIR with an existing model directory", file=sys.stderr)
            return 2
        models[role] = Path(directory)
    try:
        data_dir = resolve_data_dir(args.data_dir)
        out = args.out or DEFAULT_OUT / f"round-{args.number}"
        command = "dialogue-safety fix-it " + " ".join(argv if argv is not None else sys.argv[1:])
        report = fix_it(
            args.number,
            args.config,
            data_dir,
            args.rounds_dir or data_dir,
            out,
            models,
            args.overrides,
            command,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, ValueError, DatasetFormatError, SourceUnavailableError, DataError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(markdown_report(report))
    print(f"\nmodel: {report['model_dir']}  (hot-swap it: POST /admin/model or SIGHUP)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
