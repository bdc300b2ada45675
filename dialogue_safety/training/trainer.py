"""The training loop: multi-task mixture → BERT with dialogue segments → calibrated checkpoint.

``train(recipe, data_dir, out_dir)`` loads the recipe's tasks (``tasks``), encodes them with the shared
encoding contract and the head layout's targets (``heads``), trains with AdamW + linear warmup/decay, gradient
clipping, length-bucketed dynamic padding and (on a GPU) bf16 autocast, checks validation every ``eval_every``
steps and keeps the best weights (``validation``), averages the weights (``weight_average``), writes resumable
states (``run_dir``), then fits per-head temperatures and the decision threshold on validation, measures every
task (``final_evaluation``) and saves a self-describing checkpoint (``checkpoint``).
"""

from __future__ import annotations

import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import BertForSequenceClassification, get_linear_schedule_with_warmup

from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample, pad_batch
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.training.checkpoint import initial_weights, save_checkpoint
from dialogue_safety.training.curve import read_curve
from dialogue_safety.training.final_evaluation import evaluate_and_calibrate
from dialogue_safety.training.heads import LabelRules, context_heads, head_names, label_rules, new_card, training_rows
from dialogue_safety.training.mixture import TaskData, epoch_batches, example_weights, expected_steps_per_epoch
from dialogue_safety.training.modeling import build_model, load_base_tokenizer
from dialogue_safety.training.recipe import Recipe
from dialogue_safety.training.run_dir import (
    BEST_FILE,
    LAST_DIR,
    METRICS_FILE,
    has_state,
    log_event,
    restore_state,
    save_state,
)
from dialogue_safety.training.tasks import load_task_data
from dialogue_safety.training.validation import improves_on, validation_check
from dialogue_safety.training.weight_average import WeightAverage


@dataclass
class TrainResult:
    out_dir: Path
    card: ModelCard
    steps: int
    seconds: float
    skipped_tasks: list[str] = field(default_factory=list)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _optimizer(model: torch.nn.Module, recipe: Recipe) -> torch.optim.Optimizer:
    if recipe.freeze_word_embeddings:
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)  # type: ignore[union-attr]
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": recipe.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=recipe.learning_rate)


@dataclass
class _Data:
    """What a run trains on, prepared once: the tasks, the encoded training examples and their targets."""

    tasks: list[TaskData]
    skipped: list[str]
    tokenizer: Any
    encoder: DialogueEncoder
    heads: list[str]
    rules: LabelRules
    encoded: list[EncodedExample]
    lengths: np.ndarray
    targets: np.ndarray
    target_mask: np.ndarray
    weights: np.ndarray
    total_steps: int


@dataclass
class _Position:
    """Where the loop is (saved with every resumable state) and the best validation check so far."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best: dict[str, Any] = field(default_factory=lambda: {"macro_f1": -1.0, "selection": -1e9, "step": None})


def _prepare(recipe: Recipe, data_dir: Path) -> _Data:
    tasks, skipped = load_task_data(recipe, data_dir)
    for s in skipped:
        tqdm.write(f"warning: skipping task {s}")
    tokenizer = load_base_tokenizer(recipe.base, recipe.vocab_file)
    encoder = DialogueEncoder(tokenizer, recipe.encoding)
    heads = head_names(recipe, tasks)
    flat: list[LabelledExample] = [ex for t in tasks for ex in t.train]
    rules = label_rules(recipe, heads, flat)
    targets, target_mask = rules.targets(flat)
    context_cols = [heads.index(h) for h in context_heads(recipe, heads)]
    encoded, targets, target_mask, origin = training_rows(
        encoder.encode_batch(flat), targets, target_mask, context_cols
    )
    weights = np.concatenate(example_weights(tasks))[origin]
    steps_per_epoch = expected_steps_per_epoch(weights, recipe.batch_size)
    return _Data(
        tasks=tasks,
        skipped=skipped,
        tokenizer=tokenizer,
        encoder=encoder,
        heads=heads,
        rules=rules,
        encoded=encoded,
        lengths=np.array([len(e) for e in encoded]),
        targets=targets,
        target_mask=target_mask,
        weights=weights,
        total_steps=recipe.max_steps or math.ceil(recipe.epochs * steps_per_epoch),
    )


def _start(
    recipe: Recipe, data: _Data, device: torch.device, last: Path, resume: bool
) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, _Position, WeightAverage | None]:
    """The model, optimizer, schedule and weight average (``average_decay``): fresh (from the base or
    ``init_from``) or resumed from ``last``."""
    resuming = resume and has_state(last)
    if resuming:
        model: torch.nn.Module = BertForSequenceClassification.from_pretrained(str(last))
    elif recipe.init_from:
        model = initial_weights(recipe.init_from, data.heads)
    else:
        model = build_model(recipe.base, data.heads, data.tokenizer.get_vocab_size(), recipe.dropout)
    model = model.to(device)
    optimizer = _optimizer(model, recipe)
    warmup = int(recipe.warmup_ratio * data.total_steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, data.total_steps)
    position = _Position()
    average = WeightAverage(model, recipe.average_decay) if recipe.average_decay else None
    if resuming:
        state = restore_state(last, optimizer, scheduler)  # after the scheduler (see restore_state)
        position = _Position(state["step"], state["epoch"], state["batch_in_epoch"], state.get("best", position.best))
        if average is not None:
            if "average" not in state:
                raise ValueError(f"{last} was saved without a weight average; resume it without average_decay")
            average.restore(state["average"])
        tqdm.write(f"resuming from step {position.step} (epoch {position.epoch}, batch {position.batch_in_epoch})")
    return model, optimizer, scheduler, position, average


def _step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    data: _Data,
    idx: np.ndarray,
    recipe: Recipe,
    device: torch.device,
    amp: bool,
) -> float:
    """One optimisation step on the batch ``idx``: masked multi-head BCE, clipped, scheduled."""
    batch = pad_batch([data.encoded[i] for i in idx], data.encoder.pad_id)
    inputs = {k: torch.from_numpy(v).to(device) for k, v in batch.items()}
    y = torch.from_numpy(data.targets[idx]).to(device)
    mask = torch.from_numpy(data.target_mask[idx]).to(device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=amp):
        logits = model(**inputs).logits.float()
    loss = (torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none") * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.item())


def _validate(
    model: torch.nn.Module, data: _Data, recipe: Recipe, position: _Position, out_dir: Path, metrics_path: Path
) -> None:
    """A periodic validation check of ``model`` (the weight average when the recipe keeps one); keeps the best
    weights (``keep_best``) and logs a ``valid`` event."""
    check = validation_check(model, data.encoder, data.tasks, recipe, data.heads, data.rules)
    if improves_on(check, position.best):
        if recipe.keep_best:
            out_dir.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), out_dir / BEST_FILE)
        position.best = {"macro_f1": check["macro_f1"], "selection": check["selection"], "step": position.step}
    step, epoch = position.step, position.epoch
    log_event(
        metrics_path, {"event": "valid", "step": step, "epoch": epoch, **check, "best_step": position.best["step"]}
    )
    where = f"step {step}" + (f" (init_from {recipe.init_from})" if step == 0 else "")
    tqdm.write(
        f"valid @ {where}: macro OFFENSIVE-F1 {check['macro_f1']:.2f} "
        + " ".join(f"{k} {v:.1f}" for k, v in check["offensive_f1"].items())
        + "".join(f"; {k} flagged {100 * v:.1f} %" for k, v in check.get("flagged_rate", {}).items())
        + "".join(f"; {k} recall {v:.1f}" for k, v in check.get("general_recall", {}).items())
        + (
            f"; selection {check['selection']:.2f}"
            if recipe.false_alarm_penalty or recipe.general_recall_floors
            else ""
        )
    )


def train(
    recipe: Recipe,
    data_dir: Path,
    out_dir: Path,
    resume: bool = False,
    progress: bool = True,
    stop_after_steps: int | None = None,
) -> TrainResult:
    """Train, evaluate, calibrate and save. ``stop_after_steps`` saves a resumable state at that
    step and returns early (time-boxed runs; the resume test)."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out_dir / METRICS_FILE
    if recipe.num_threads:
        torch.set_num_threads(recipe.num_threads)
    _seed_everything(recipe.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = _prepare(recipe, data_dir)
    last = out_dir / LAST_DIR
    model, optimizer, scheduler, position, average = _start(recipe, data, device, last, resume)
    scored = average.model if average is not None else model  # what checks, keep-best and the saved model use
    if position.step == 0 and metrics_path.exists():
        metrics_path.unlink()
    log_event(
        metrics_path,
        {
            "event": "start",
            "recipe": recipe.to_dict(),
            "total_steps": data.total_steps,
            "train_examples": len(data.encoded),
            "heads": data.heads,
            "skipped": data.skipped,
            "resumed_at": position.step,
        },
    )
    amp = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if recipe.init_from and recipe.eval_every > 0 and position.step == 0:
        # continued training: the starting weights are the first candidate keep_best compares against
        _validate(scored, data, recipe, position, out_dir, metrics_path)
    model.train()
    total = data.total_steps
    bar = tqdm(total=total, initial=position.step, disable=not progress, desc=f"train {recipe.name}", unit="step")
    running: list[float] = []
    while position.step < total:
        plan = epoch_batches(
            data.lengths, data.weights, recipe.batch_size, recipe.bucket_size, recipe.seed, position.epoch
        )
        while position.batch_in_epoch < len(plan) and position.step < total:
            running.append(_step(model, optimizer, scheduler, data, plan[position.batch_in_epoch], recipe, device, amp))
            if average is not None:
                average.update()
            position.step += 1
            position.batch_in_epoch += 1
            step = position.step
            bar.update(1)
            if step % recipe.log_every == 0 or step == total:
                avg = float(np.mean(running[-recipe.log_every :]))
                lr = scheduler.get_last_lr()[0]
                bar.set_postfix(loss=f"{avg:.4f}", lr=f"{lr:.2e}", epoch=position.epoch)
                log_event(
                    metrics_path,
                    {
                        "event": "train",
                        "step": step,
                        "epoch": position.epoch,
                        "loss": avg,
                        "lr": lr,
                        "elapsed_s": time.perf_counter() - t0,
                    },
                )
            if recipe.eval_every > 0 and (step % recipe.eval_every == 0 or step == total):
                _validate(scored, data, recipe, position, out_dir, metrics_path)
            stopping = stop_after_steps is not None and step >= stop_after_steps and step < total
            periodic = bool(recipe.checkpoint_every) and step % recipe.checkpoint_every == 0 and step < total
            if stopping or periodic:
                state = {
                    "step": step,
                    "epoch": position.epoch,
                    "batch_in_epoch": position.batch_in_epoch,
                    "best": position.best,
                    **({"average": average.state()} if average is not None else {}),
                }
                save_state(out_dir, model, optimizer, scheduler, state)
            if stopping:
                bar.close()
                card = new_card(recipe, data.heads)
                return TrainResult(out_dir, card, step, time.perf_counter() - t0, data.skipped)
        if position.batch_in_epoch >= len(plan):
            position.epoch, position.batch_in_epoch = position.epoch + 1, 0
    bar.close()
    best = position.best
    if recipe.keep_best and best["step"] is not None and best["step"] != position.step:
        model.load_state_dict(torch.load(out_dir / BEST_FILE, map_location=device))
        log_event(metrics_path, {"event": "restored_best", "step": best["step"], "macro_f1": best["macro_f1"]})
        tqdm.write(f"restored the weights of step {best['step']} (valid macro OFFENSIVE-F1 {best['macro_f1']:.2f})")
    elif average is not None:
        model.load_state_dict(average.model.state_dict())

    card = evaluate_and_calibrate(
        model, data.encoder, data.tasks, recipe, data.heads, data_dir, metrics_path, progress, data.rules
    )
    curve = read_curve(metrics_path)  # every leg of a run resumed across sessions
    card.training.update(
        {
            "steps": position.step,
            "train_seconds": max(curve["train_seconds"], round(time.perf_counter() - t0, 1)),
            "legs": max(1, curve["legs"]),
            "skipped_tasks": data.skipped,
            "device": device.type,
            "selected_step": best["step"] if recipe.keep_best else position.step,
            "curve": {"valid": curve["valid"], "loss": curve["loss"]},
        }
    )
    save_checkpoint(out_dir, cast(BertForSequenceClassification, model.cpu()), data.tokenizer, card)
    shutil.rmtree(last, ignore_errors=True)
    (out_dir / BEST_FILE).unlink(missing_ok=True)
    log_event(metrics_path, {"event": "done", "seconds": time.perf_counter() - t0, "threshold": card.threshold})
    return TrainResult(out_dir, card, position.step, time.perf_counter() - t0, data.skipped)
