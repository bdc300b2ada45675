"""``dialogue-safety export CHECKPOINT OUT_DIR``: parity-checked ONNX model directory with its variants.

Exit status: 0 written; 1 ONNX/torch parity failed (nothing written; the message gives the max
difference); 2 bad arguments or an unreadable checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from dialogue_safety.core.model_dir import (
    ARTIFACT_FILE,
    CARD_FILE,
    CARD_MARKDOWN_FILE,
    CHECKPOINT_FILES,
    TOKENIZER_FILE,
)
from dialogue_safety.core.schema import LabelledExample

DEFAULT_EVAL_SOURCES = ("olid", "diasafety", "convabuse", "hatemoji", "dynahate", "hatecheck")


def build_parser(prog: str) -> argparse.ArgumentParser:
    from dialogue_safety.core.variants import INT8_CANDIDATES, INT8_PRESETS
    from dialogue_safety.export.settings import DEFAULT_OPSET, DEFAULT_TOLERANCE, DEFAULT_VARIANTS

    p = argparse.ArgumentParser(
        prog=prog,
        description="Export a training checkpoint to a self-describing ONNX model directory ("
        f"{ARTIFACT_FILE}, {TOKENIZER_FILE}, {CARD_FILE}, {CARD_MARKDOWN_FILE}). ONNX and torch logits are "
        "compared on a fixed batch of "
        "dialogues before anything is written; the export fails if they differ by more than --tolerance.",
    )
    p.add_argument("checkpoint", type=Path, help=f"training checkpoint directory ({', '.join(CHECKPOINT_FILES)}...)")
    p.add_argument("out_dir", type=Path, help="model directory to write (replaced if it is an earlier export)")
    p.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="variants to derive and check now, comma-separated (default: %(default)s); the service derives "
        "missing ones at first start",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="max abs logit difference ONNX fp32 vs torch (default: %(default)s); a logit may also differ by its "
        'fp32 order allowance when that is larger (docs/runtime.md, "Parity")',
    )
    p.add_argument(
        "--ship",
        action="store_true",
        help=f"store the weights as fp16 in {ARTIFACT_FILE} (~half the size; for committing under the 60 MB cap); "
        "the weights are rounded to fp16 before the parity check, and fp32 is re-derived exactly at load",
    )
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default: %(default)s)")
    p.add_argument(
        "--int8-presets",
        "--int8-preset",
        dest="int8_presets",
        default=",".join(INT8_CANDIDATES),
        help="int8 recipes to judge, comma-separated (the first breaks ties), from: "
        f"{', '.join(sorted(INT8_PRESETS))}; of those that pass the gate on the validation splits of "
        "--eval-sources, alone or with the fp32 check of the dialogues they score near the threshold, the cheapest "
        "to serve (check included) becomes the int8 variant (static ones are calibrated on validation dialogues "
        "stored in the model directory); see docs/runtime.md (default: %(default)s)",
    )
    p.add_argument(
        "--data-dir", type=Path, default=None, help="datasets for the variant comparison and the category thresholds"
    )
    p.add_argument(
        "--eval-sources",
        default=",".join(DEFAULT_EVAL_SOURCES),
        help="sources whose test split judges the variants (default: %(default)s); int8 becomes the CPU default "
        "only if it passes the gate (decision agreement with fp32 >= 99 %% on every split, mean ΔF1 >= -0.3, "
        "no split's bootstrap interval of ΔF1 entirely below -0.5; dialogue_safety/export/comparison.py)",
    )
    p.add_argument(
        "--no-eval",
        action="store_true",
        help="skip the variant comparison (CPU default: optimized) and the per-category thresholds (tuned on the "
        "validation splits of the training sources: dialogue_safety/export/categories.py)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="only errors")
    return p


def load_test_sets(
    data_dir: Path | None, sources: Sequence[str], split: str = "test"
) -> tuple[dict[str, list[LabelledExample]], list[str]]:
    """{"<source>/<split>": examples} for the sources that are present, and notes about the others
    (missing sources are skipped, malformed files raise:
    :func:`dialogue_safety.sources.registry.load_present_sources`)."""
    from dialogue_safety.sources.data_dir import resolve_data_dir
    from dialogue_safety.sources.registry import load_present_sources

    try:
        root = resolve_data_dir(data_dir)
    except FileNotFoundError as exc:
        return {}, [f"no data directory ({exc})"]
    present = load_present_sources(sources, root, splits=[split])
    sets = {f"{name}/{split}": examples for name, examples in present.examples.items()}
    return sets, [f"{name}: not used ({why})" for name, why in present.skipped.items()]


def categories_dir(data_dir: Path | None) -> Path | None:
    """The data directory whose validation splits tune the per-category thresholds (None: there is none)."""
    from dialogue_safety.sources.data_dir import resolve_data_dir

    try:
        return resolve_data_dir(data_dir)
    except FileNotFoundError:
        return None


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety export") -> int:
    args = build_parser(prog).parse_args(argv)
    from dialogue_safety.training.checkpoint_layout import checkpoint_problem

    problem = checkpoint_problem(args.checkpoint)  # before any data is read or torch is loaded
    if problem is None and args.data_dir is not None and not Path(args.data_dir).is_dir():
        problem = f"--data-dir {args.data_dir} is not a directory (leave it out for the default, or fix the path)"
    if problem:
        print(f"{prog}: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.ERROR if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    say = (lambda *_: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr))

    from dialogue_safety.core.variants import INT8_PRESETS
    from dialogue_safety.export.card_markdown import int8_candidate_verdict
    from dialogue_safety.export.onnx_export import ExportError, ParityError, export_checkpoint

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    presets = [v.strip() for v in args.int8_presets.split(",") if v.strip()]
    unknown = [v for v in presets if v not in INT8_PRESETS]
    if unknown or not presets:
        print(
            f"{prog}: --int8-presets: unknown {unknown}; choose from {', '.join(sorted(INT8_PRESETS))}", file=sys.stderr
        )
        return 2
    test_sets: dict[str, list[LabelledExample]] = {}
    validation_sets: dict[str, list[LabelledExample]] = {}
    if not args.no_eval and any(v in names for v in ("int8", "optimized")):
        sources = [s.strip() for s in args.eval_sources.split(",") if s.strip()]
        try:
            test_sets, notes = load_test_sets(args.data_dir, sources)
            if "int8" in names:
                validation_sets, _ = load_test_sets(args.data_dir, sources, split="valid")
        except ValueError as exc:  # a malformed dataset file (DatasetFormatError) or an unknown source
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
        for note in notes:
            say(f"{prog}: variant comparison: {note}")
        if test_sets:
            say(f"{prog}: comparing variants on {', '.join(f'{k} ({len(v)})' for k, v in test_sets.items())}")
        if validation_sets:
            listed = ", ".join(f"{k} ({len(v)})" for k, v in validation_sets.items())
            say(f"{prog}: int8 calibration and choice on {listed}")
    try:
        result = export_checkpoint(
            args.checkpoint,
            args.out_dir,
            variant_names=names,
            tolerance=args.tolerance,
            ship=args.ship,
            opset=args.opset,
            test_sets=test_sets or None,
            recipes={"int8": {"from": "optimized", **INT8_PRESETS[presets[0]], "preset": presets[0]}},
            validation_sets=validation_sets or None,
            int8_candidates=presets,
            categories_data_dir=None if args.no_eval else categories_dir(args.data_dir),
        )
    except ParityError as exc:
        print(f"{prog}: PARITY CHECK FAILED: {exc}", file=sys.stderr)
        return 1
    except (ExportError, OSError) as exc:  # OSError: an output directory it cannot write
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    card = result.card
    say(f"{prog}: wrote {result.out_dir} ({card.model_id})")
    say(
        f"  {ARTIFACT_FILE}: {card.export['artifact_bytes'] / 1e6:.1f} MB, weights {card.export['weights_storage']}, "
        f"max |onnx - torch| {result.max_abs_diff:.3g} (tolerance {args.tolerance:g})"
    )
    for name, entry in card.export.get("variants", {}).items():
        diff = entry.get("max_abs_diff")
        say(
            f"  {name:<9} {entry['file']:<22} {entry['bytes'] / 1e6:6.1f} MB  max |Δ| "
            f"{'—' if diff is None else format(diff, '.3g')}{'  (' + entry['note'] + ')' if entry.get('note') else ''}"
        )
    selection = card.export.get("int8_selection")
    if selection:
        for name, entry in selection.get("candidates", {}).items():
            say(f"  int8 candidate {name:<16} validation: {int8_candidate_verdict(entry, strong='')}")
        say(f"  int8 recipe: {selection['chosen']}{'' if selection.get('passed') else ' (none passed)'}")
    gates = (card.export.get("comparison") or {}).get("gate", {})
    for name, verdict in gates.items():
        say(
            f"  gate on test, {name:<9}: {verdict['why']} (min agreement {100 * verdict['min_agreement']:.2f} %, "
            f"mean ΔF1 {verdict['mean_delta_f1']:+.2f})"
        )
    say(f"  CPU default: {card.cpu_variant} — {card.export.get('cpu_variant_reason')}")
    for head, entry in card.categories.items():
        say(
            f"  category {head:<18} threshold {entry['threshold']:.3f} (validation macro F1 "
            f"{entry['valid_macro_f1']:.1f}){' score only' if entry['score_only'] else ''}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
