"""Weight averaging ("model soups", Wortsman et al. 2022): one model from several fine-tuned runs.

``python -m lab.experiments.soup CKPT [CKPT ...] --out DIR --data-dir DIR`` averages the weights of
checkpoints fine-tuned from the same base (same geometry, heads and tokenizer), then evaluates
and calibrates the average exactly as a training run does (temperature and threshold on the
validation splits, metrics on valid and test) and writes a checkpoint the export takes as is.
The first checkpoint's recipe (tasks, encoding) defines the data and the input encoding; the
other checkpoints must have been trained with the same heads. ``--greedy`` adds the checkpoints
one by one (best validation first) and keeps each only if the soup's validation macro
OFFENSIVE-F1 does not drop ("greedy soup"); test splits are never used to choose.

Averaging costs nothing at inference: the soup is one model of the same size.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import BertForSequenceClassification

from dialogue_safety.core.model_dir import CARD_FILE, TOKENIZER_FILE
from dialogue_safety.sources.data_dir import resolve_data_dir
from dialogue_safety.training.checkpoint import load_checkpoint, save_checkpoint
from dialogue_safety.training.final_evaluation import evaluate_and_calibrate
from dialogue_safety.training.heads import head_names
from dialogue_safety.training.recipe import recipe_from_dict
from dialogue_safety.training.run_dir import METRICS_FILE, log_event
from dialogue_safety.training.tasks import load_task_data
from dialogue_safety.training.validation import validation_check


class SoupError(ValueError):
    """The checkpoints cannot be averaged (different geometry, heads, tokenizer or input encoding)."""


def average_state_dicts(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts with identical keys and shapes (integer buffers: the first's)."""
    if not states:
        raise SoupError("nothing to average")
    keys = list(states[0])
    for i, s in enumerate(states[1:], start=1):
        if list(s) != keys:
            raise SoupError(f"checkpoint {i} has different parameters from checkpoint 0")
        for k in keys:
            if s[k].shape != states[0][k].shape:
                raise SoupError(f"checkpoint {i}: {k} has shape {tuple(s[k].shape)}, not {tuple(states[0][k].shape)}")
    out: dict[str, torch.Tensor] = {}
    for k in keys:
        if states[0][k].is_floating_point():
            out[k] = torch.stack([s[k].float() for s in states]).mean(dim=0).to(states[0][k].dtype)
        else:
            out[k] = states[0][k].clone()  # e.g. position_ids
    return out


def _check_compatible(paths: Sequence[Path]) -> None:
    cards = [json.loads((p / CARD_FILE).read_text(encoding="utf-8")) for p in paths]
    tokenizers = [(p / TOKENIZER_FILE).read_bytes() for p in paths]
    for p, card, tok in zip(paths[1:], cards[1:], tokenizers[1:], strict=True):
        if card["heads"] != cards[0]["heads"]:
            raise SoupError(f"{p}: heads {card['heads']} differ from {paths[0]}: {cards[0]['heads']}")
        if tok != tokenizers[0]:
            raise SoupError(f"{p}: tokenizer differs from {paths[0]}'s")
        if card.get("encoding") != cards[0].get("encoding"):
            raise SoupError(
                f"{p}: encoding {card.get('encoding')} differs from {paths[0]}'s {cards[0].get('encoding')}: "
                "a soup is evaluated and served with one input encoding"
            )


def make_soup(
    checkpoints: Sequence[Path], out_dir: Path, data_dir: Path, *, greedy: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Average ``checkpoints`` (all, or greedily), evaluate + calibrate, save to ``out_dir``."""
    t0 = time.perf_counter()
    paths = [Path(p) for p in checkpoints]
    _check_compatible(paths)
    model, encoder, card0 = load_checkpoint(paths[0])
    recipe = recipe_from_dict(card0.training["recipe"])
    tasks, skipped = load_task_data(recipe, data_dir)
    heads = head_names(recipe, tasks)
    # copies: load_state_dict below writes into the live tensors model.state_dict() returns
    states = [{k: v.detach().clone() for k, v in model.state_dict().items()}] + [
        BertForSequenceClassification.from_pretrained(str(p)).state_dict() for p in paths[1:]
    ]

    def score(members: list[int]) -> dict[str, Any]:
        model.load_state_dict(average_state_dicts([states[i] for i in members]))
        return validation_check(model, encoder, tasks, recipe, heads)

    singles = {i: score([i]) for i in range(len(paths))}
    if greedy:
        order = sorted(singles, key=lambda i: -singles[i]["macro_f1"])
        members, best = [order[0]], singles[order[0]]
        for i in order[1:]:
            trial = score([*members, i])
            if trial["macro_f1"] >= best["macro_f1"]:
                members, best = [*members, i], trial
        model.load_state_dict(average_state_dicts([states[i] for i in members]))  # the last trial may be a reject
    else:
        members = list(range(len(paths)))
        best = score(members)  # leaves the model holding the full average

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / METRICS_FILE
    metrics_path.unlink(missing_ok=True)
    summary = {
        "event": "soup",
        "checkpoints": [str(p) for p in paths],
        "greedy": greedy,
        "members": [str(paths[i]) for i in members],
        "valid_single": {str(paths[i]): s for i, s in singles.items()},
        "valid_soup": best,
    }
    log_event(metrics_path, summary)
    card = evaluate_and_calibrate(model, encoder, tasks, recipe, heads, data_dir, metrics_path, progress)
    card.training.update(
        {
            "soup": {"members": summary["members"], "greedy": greedy, "valid_macro_f1": best["macro_f1"]},
            "skipped_tasks": skipped,
            "steps": card0.training.get("steps"),
            "train_seconds": card0.training.get("train_seconds"),
            "device": card0.training.get("device"),
        }
    )
    save_checkpoint(out_dir, model, encoder.tokenizer, card)
    log_event(metrics_path, {"event": "done", "seconds": time.perf_counter() - t0, "threshold": card.threshold})
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.experiments.soup", description="Average fine-tuned checkpoints into one model."
    )
    parser.add_argument("checkpoints", nargs="+", type=Path, help="checkpoint directories (same base and heads)")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    parser.add_argument("--data-dir", type=Path, default=None, help="datasets (default: $DIALOGUE_SAFETY_DATA_DIR)")
    parser.add_argument("--greedy", action="store_true", help="keep a checkpoint only if validation does not drop")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    if len(args.checkpoints) < 2:
        parser.error("give at least two checkpoints")
    try:
        summary = make_soup(
            args.checkpoints, args.out, resolve_data_dir(args.data_dir), greedy=args.greedy, progress=not args.quiet
        )
    except (SoupError, FileNotFoundError) as exc:
        parser.exit(2, f"error: {exc}\n")
    for path, s in summary["valid_single"].items():
        print(f"{path}: valid macro OFFENSIVE-F1 {s['macro_f1']:.2f}")
    print(f"soup of {len(summary['members'])}: valid macro OFFENSIVE-F1 {summary['valid_soup']['macro_f1']:.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
