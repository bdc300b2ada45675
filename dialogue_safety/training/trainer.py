"""The training loop: multi-task mixture → BERT with dialogue segments → calibrated checkpoint.

``train(recipe, data_dir, out_dir)`` loads the recipe's tasks, encodes them with the shared
encoding contract, trains with AdamW + linear warmup/decay, gradient clipping, length-bucketed
dynamic padding and (on a GPU) bf16 autocast, writes resumable checkpoints, evaluates every
task and round on valid and test, fits per-head temperatures and the decision threshold on
validation, and saves a self-describing checkpoint (see ``dialogue_safety.training.checkpoint``).
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import BertForSequenceClassification, get_linear_schedule_with_warmup

from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample, pad_batch
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import CHECKPOINT_FILES, is_checkpoint
from dialogue_safety.core.schema import LabelledExample, Split
from dialogue_safety.core.scoring import head_probabilities, is_offensive, main_scores
from dialogue_safety.sources import registry
from dialogue_safety.training.calibration import choose_threshold, false_alarm_cost, fit_temperature, safe_only
from dialogue_safety.training.checkpoint import save_checkpoint
from dialogue_safety.training.curve import read_curve
from dialogue_safety.training.harmonise import (
    ATTRIBUTE_HEADS,
    CONTEXT_HEAD,
    HARMONISED,
    HEAD_ORDER,
    SERVED_HEAD,
    AbuseTeacher,
    abusive_hate_negatives,
    attribute_heads,
    harmonised_targets,
    served_gold_from_targets,
)
from dialogue_safety.training.inference import num_labels, predict_logits
from dialogue_safety.training.metrics import binary_metrics, expected_calibration_error
from dialogue_safety.training.mixture import TaskData, epoch_batches, example_weights, expected_steps_per_epoch
from dialogue_safety.training.modeling import build_model, load_base_tokenizer
from dialogue_safety.training.recipe import Recipe

STATE_FILE = "training_state.pt"
BEST_FILE = "best_model.pt"
LAST_DIR = "last"
METRICS_FILE = "metrics.jsonl"
EVAL_ONLY_SOURCES = frozenset({"hatecheck"})


class DataError(RuntimeError):
    """The recipe asks for data that is missing or only a format sample."""


@dataclass
class TrainResult:
    out_dir: Path
    card: ModelCard
    steps: int
    seconds: float
    skipped_tasks: list[str] = field(default_factory=list)


def _subsample(examples: list[LabelledExample], limit: int | None, seed: int) -> list[LabelledExample]:
    if limit is None or len(examples) <= limit:
        return examples
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(examples), size=limit, replace=False))
    return [examples[i] for i in keep]


def load_task_data(recipe: Recipe, data_dir: Path) -> tuple[list[TaskData], list[str]]:
    """Load every task of the recipe; missing/sample-only optional tasks are skipped (and named)."""
    for spec in recipe.tasks:
        if spec.source in EVAL_ONLY_SOURCES:
            raise DataError(f"task {spec.name!r}: {spec.source} is an evaluation-only suite; never train on it")
    # the one missing/malformed policy: malformed files raise; what is missing is decided per task below
    present = registry.load_present_sources(dict.fromkeys(spec.source for spec in recipe.tasks), data_dir)
    tasks: list[TaskData] = []
    skipped: list[str] = []
    for spec in recipe.tasks:
        if spec.source not in present.examples:
            problem = f"{spec.source} in {data_dir}: {present.skipped[spec.source]}"
            if spec.required:
                raise DataError(f"task {spec.name!r}: {problem}")
            skipped.append(f"{spec.name}: {problem}")
            continue
        rows = [
            ex
            for ex in present.examples[spec.source]
            if (spec.task is None or ex.task_name == spec.task)
            and (spec.rounds is None or str(ex.round) in spec.rounds)
        ]
        split = {s: [ex for ex in rows if ex.split == s] for s in Split}
        train_rows = _subsample(split[Split.TRAIN], recipe.max_examples_per_task, recipe.seed)
        if not train_rows:
            raise DataError(f"task {spec.name!r} has no training examples in {data_dir}")
        tasks.append(TaskData(spec, train_rows, split[Split.VALID], split[Split.TEST]))
    if not tasks:
        raise DataError(f"none of the recipe's tasks has data in {data_dir}")
    return tasks, skipped


def head_names(recipe: Recipe, tasks: Sequence[TaskData]) -> list[str]:
    if recipe.heads == "shared":
        return ["offensive"]
    families = {ex.family.value for t in tasks for ex in t.train}
    if recipe.heads == HARMONISED:
        families.add(SERVED_HEAD)
        families |= attribute_heads(ex for t in tasks for ex in t.train)
    return [f for f in HEAD_ORDER if f in families]


def is_decomposed(recipe: Recipe) -> bool:
    """Utterance heads read the utterance alone, the context head the dialogue (harmonise.py)."""
    return recipe.encoding.context_mode == "decomposed"


def context_heads(recipe: Recipe, heads: Sequence[str]) -> list[str]:
    """The heads a decomposed model reads from the dialogue row (none otherwise)."""
    if not is_decomposed(recipe):
        return []
    if recipe.heads != HARMONISED or CONTEXT_HEAD not in heads:
        raise ValueError(
            f"encoding.context_mode = 'decomposed' needs heads = '{HARMONISED}' and a {CONTEXT_HEAD} source "
            f"(a context-decided task such as diasafety); got heads = {recipe.heads!r} with {list(heads)}"
        )
    return [CONTEXT_HEAD]


def score_heads(recipe: Recipe, heads: list[str]) -> list[str]:
    """The heads whose (max) calibrated probability is the served OFFENSIVE score."""
    if recipe.heads == HARMONISED:
        return [SERVED_HEAD, *context_heads(recipe, heads)]
    return list(heads)


def new_card(recipe: Recipe, heads: list[str], **fields: Any) -> ModelCard:
    """A card with the recipe's name, version and head layout (the one place that sets them)."""
    return ModelCard(
        name=recipe.model_name,
        version=recipe.version,
        heads=heads,
        score_heads=score_heads(recipe, heads),
        context_heads=context_heads(recipe, heads),
        **fields,
    )


@dataclass
class LabelRules:
    """How a recipe's head layout turns examples into per-head targets and served gold labels."""

    mode: str
    heads: list[str]
    teacher: AbuseTeacher | None = None
    decomposed: bool = False

    def targets(self, examples: Sequence[LabelledExample]) -> tuple[np.ndarray, np.ndarray]:
        if self.mode == HARMONISED:
            abusive = abusive_hate_negatives(examples, self.teacher)
            return harmonised_targets(examples, self.heads, abusive, self.decomposed)
        return head_targets(examples, self.heads, self.mode)

    def served_gold(self, examples: Sequence[LabelledExample]) -> tuple[np.ndarray, np.ndarray]:
        """Gold for the served score and which examples have one (harmonised: masked hate negatives
        the teacher calls abusive have none); other modes: the source's own label for every example."""
        gold = np.array([int(ex.label.is_positive) for ex in examples], dtype=int)
        if self.mode != HARMONISED:
            return gold, np.ones(len(examples), dtype=bool)
        y, mask = self.targets(examples)
        return served_gold_from_targets(y, mask, self.heads, self.decomposed)


def label_rules(recipe: Recipe, heads: list[str], train_examples: Sequence[LabelledExample]) -> LabelRules:
    teacher = AbuseTeacher.fit(train_examples) if recipe.heads == HARMONISED else None
    return LabelRules(recipe.heads, heads, teacher, is_decomposed(recipe))


def training_rows(
    encoded: Sequence[EncodedExample], targets: np.ndarray, mask: np.ndarray, context_cols: Sequence[int]
) -> tuple[list[EncodedExample], np.ndarray, np.ndarray, np.ndarray]:
    """The rows a decomposed model trains on and the example each row came from: the dialogue row
    teaches only the context heads, the utterance-alone row only the others (an example without
    history has one row and no context target). Without ``context_cols``: one row per example."""
    if not context_cols:
        return list(encoded), targets, mask, np.arange(len(encoded))
    ctx = np.zeros(targets.shape[1], dtype=bool)
    ctx[list(context_cols)] = True
    rows: list[EncodedExample] = []
    origin: list[int] = []
    row_mask: list[np.ndarray] = []
    for i, e in enumerate(encoded):
        if e.alone is not None:
            if mask[i, ctx].any():
                rows.append(EncodedExample(e.input_ids, e.token_type_ids, e.attention_mask))
                origin.append(i)
                row_mask.append(np.where(ctx, mask[i], 0.0))
            if mask[i, ~ctx].any():
                rows.append(e.alone)
                origin.append(i)
                row_mask.append(np.where(ctx, 0.0, mask[i]))
        elif mask[i, ~ctx].any():
            rows.append(e)
            origin.append(i)
            row_mask.append(np.where(ctx, 0.0, mask[i]))
    idx = np.array(origin, dtype=np.int64)
    return rows, targets[idx], np.array(row_mask, dtype=np.float32).reshape(len(rows), -1), idx


# Label semantics (``heads = "hierarchical"``): hate against a group is offensive, and an offensive
# utterance is unsafe to send in any context (hateful ⊂ offensive ⊂ unsafe_in_context). A positive
# of one family is therefore a positive for the broader heads, and a negative of one family a
# negative for the narrower heads; everything else stays unlabelled (masked out of the loss).
BROADER = {"hateful": ("offensive", "unsafe_in_context"), "offensive": ("unsafe_in_context",), "unsafe_in_context": ()}
NARROWER = {"unsafe_in_context": ("offensive", "hateful"), "offensive": ("hateful",), "hateful": ()}


def head_targets(examples: Sequence[LabelledExample], heads: list[str], mode: str) -> tuple[np.ndarray, np.ndarray]:
    """[n, heads] targets and loss masks for the head layout."""
    y = np.zeros((len(examples), len(heads)), dtype=np.float32)
    mask = np.zeros_like(y)
    col = {h: i for i, h in enumerate(heads)}
    for i, ex in enumerate(examples):
        positive = float(ex.label.is_positive)
        own = 0 if len(heads) == 1 else col[ex.family.value]
        y[i, own], mask[i, own] = positive, 1.0
        if mode != "hierarchical":
            continue
        for other in (BROADER if positive else NARROWER)[ex.family.value]:
            if other in col:
                y[i, col[other]], mask[i, col[other]] = positive, 1.0
    return y, mask


def _head_of(ex: LabelledExample, heads: list[str]) -> int:
    return 0 if len(heads) == 1 else heads.index(ex.family.value)


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


def validation_check(
    model: torch.nn.Module,
    encoder: DialogueEncoder,
    tasks: Sequence[TaskData],
    recipe: Recipe,
    heads: list[str],
    rules: LabelRules | None = None,
) -> dict[str, Any]:
    """OFFENSIVE-F1 per source on the valid splits at the threshold the recipe's objective picks (uncalibrated scores).

    The periodic check behind ``eval_every`` / ``keep_best``; it never looks at a test split.
    """
    was_training = model.training
    model.eval()
    rules = rules or LabelRules(recipe.heads, heads, decomposed=is_decomposed(recipe))
    card = new_card(recipe, heads)
    valid_sets = {}
    for t in tasks:
        if t.valid:
            z = _logits_for(model, encoder, t.valid, recipe, heads)
            gold, keep = rules.served_gold(t.valid)
            valid_sets[t.spec.name] = (gold[keep], main_scores(head_probabilities(z, card), card)[keep])
    if was_training:
        model.train()
    check = score_valid_sets(threshold_sets(valid_sets, recipe), threshold_penalty(recipe))
    return {**check, "selection": selection_score(check, recipe.false_alarm_penalty)}


def selection_score(check: dict[str, Any], false_alarm_penalty: float) -> float:
    """What keep-best maximises: the macro OFFENSIVE-F1 less ``false_alarm_penalty`` points per point (%)
    flagged of the SAFE-only validation sets (their mean; nothing when there are none)."""
    return float(
        check["macro_f1"] - false_alarm_cost(list(check.get("flagged_rate", {}).values()), false_alarm_penalty)
    )


def threshold_penalty(recipe: Recipe) -> float:
    """The false-alarm penalty the threshold is chosen with: the recipe's under the ``selection`` objective
    (the periodic check then scores each checkpoint at the threshold it would ship with), else none."""
    return recipe.false_alarm_penalty if recipe.threshold_objective == "selection" else 0.0


def threshold_sets(valid_sets: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    """The validation sets the threshold is tuned on (``recipe.threshold_tasks``; all when empty)."""
    if not recipe.threshold_tasks:
        return valid_sets
    return {name: v for name, v in valid_sets.items() if name in recipe.threshold_tasks}


def score_valid_sets(
    valid_sets: dict[str, tuple[np.ndarray, np.ndarray]], false_alarm_penalty: float = 0.0
) -> dict[str, Any]:
    """The periodic check's numbers from (served gold, served score) per source: OFFENSIVE-F1 per
    source at the macro-best threshold (less ``false_alarm_penalty`` points per point flagged of the
    sources without positives when it is set: the ``selection`` objective), their mean, and for sources
    without positives the share flagged."""
    if not valid_sets:
        return {"macro_f1": 0.0, "threshold": 0.5, "offensive_f1": {}}
    threshold, per_source = choose_threshold(valid_sets, "selection", false_alarm_penalty)
    # sources with no positives (written SAFE sets) have no F1: how many of them the model flags instead
    flagged = {
        name: float(np.mean(is_offensive(scores, threshold))) for name, (_, scores) in safe_only(valid_sets).items()
    }
    return {
        "macro_f1": float(np.mean(list(per_source.values()))),
        "threshold": threshold,
        "offensive_f1": per_source,
        **({"flagged_rate": flagged} if flagged else {}),
    }


def log_event(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")


class WeightAverage:
    """An exponential moving average of a model's trained weights (``recipe.average_decay``).

    Each update moves the average towards the current weights by ``max(1 - decay, 1 / updates)``: a plain
    running mean over the first ``1 / (1 - decay)`` updates (the start weighs no more than any early step), then
    exponential; the early steps still weigh ``decay ** (steps - 1 / (1 - decay))`` (0.37 at twice that many).
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.updates = 0
        self.model = copy.deepcopy(model).eval()
        pairs = [(a, p) for a, p in zip(self.model.parameters(), model.parameters(), strict=True) if p.requires_grad]
        self._averaged: list[torch.Tensor] = [a for a, _ in pairs]
        self._current: list[torch.Tensor] = [p for _, p in pairs]

    @torch.no_grad()
    def update(self) -> None:
        self.updates += 1
        torch._foreach_lerp_(self._averaged, self._current, max(1.0 - self.decay, 1.0 / self.updates))

    def state(self) -> dict[str, Any]:
        return {"weights": self.model.state_dict(), "updates": self.updates}

    def restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["weights"])  # in place: the pairs above stay bound
        self.updates = state["updates"]


def _save_state(
    out: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, state: dict[str, Any]
) -> None:
    tmp = out / (LAST_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)  # type: ignore[operator]
    torch.save(
        {
            **state,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
        },
        tmp / STATE_FILE,
    )
    final = out / LAST_DIR
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)


def initial_weights(path: str | Path, heads: list[str]) -> BertForSequenceClassification:
    """The weights of a training checkpoint to continue from (``recipe.init_from``); its heads must
    be the recipe's."""
    if not is_checkpoint(path):
        raise ValueError(f"init_from: {path} is not a training checkpoint (needs {', '.join(CHECKPOINT_FILES)})")
    model = BertForSequenceClassification.from_pretrained(str(path))
    found = [model.config.id2label[i] for i in range(model.config.num_labels)]
    if found != heads:
        raise ValueError(f"init_from: {path} has heads {found}, but the recipe trains {heads}")
    return model


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
    resuming = resume and (last / STATE_FILE).is_file()
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
        state = torch.load(last / STATE_FILE, weights_only=False)
        # after the scheduler: building it rewrites the learning rates the optimizer state restores
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
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
    # a state saved before the selection score existed holds the macro F1 only (penalty 0: the same number)
    if check["selection"] > position.best.get("selection", position.best["macro_f1"]):
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
        + (f"; selection {check['selection']:.2f}" if recipe.false_alarm_penalty else "")
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
                _save_state(out_dir, model, optimizer, scheduler, state)
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


def _logits_for(
    model: torch.nn.Module,
    encoder: DialogueEncoder,
    examples: Sequence[LabelledExample],
    recipe: Recipe,
    heads: Sequence[str],
) -> np.ndarray:
    if not examples:
        return np.zeros((0, num_labels(model)), dtype=np.float32)
    enc: list[EncodedExample] = encoder.encode_batch(examples)
    cols = [list(heads).index(h) for h in context_heads(recipe, heads)]
    return predict_logits(model, enc, recipe.eval_batch_tokens, encoder.pad_id, cols)


def _grouped_metrics(examples: Sequence[LabelledExample], scores: np.ndarray, threshold: float) -> dict[str, Any]:
    gold = np.array([int(ex.label.is_positive) for ex in examples])
    out: dict[str, Any] = {"all": binary_metrics(gold, scores, threshold)}
    rounds: dict[str, list[int]] = defaultdict(list)
    for i, ex in enumerate(examples):
        if ex.round is not None:
            rounds[str(ex.round)].append(i)
    if rounds:
        out["rounds"] = {r: binary_metrics(gold[ix], scores[ix], threshold) for r, ix in sorted(rounds.items())}
    return out


def _family_head_metrics(
    tasks: Sequence[TaskData],
    eval_rows: dict[str, list[LabelledExample]],
    logits: dict[tuple[str, str], np.ndarray],
    card: ModelCard,
) -> dict[str, Any]:
    """Each head (a ``categories`` entry) judged on the sources that label it, against their own labels, at
    the head's own validation-tuned threshold (macro over those sources): a label family's head on that
    family's sources, an attribute head (``violence``, ``unsafe_request``) on the sources that label the
    attribute on every row (``metadata[head]``), gold being that attribute."""
    out: dict[str, Any] = {}
    for h, head in enumerate(card.heads):
        attribute = head in ATTRIBUTE_HEADS

        def labelled(rows: Sequence[LabelledExample], head: str = head, attribute: bool = attribute) -> list[int]:
            """The rows that label this head: an attribute head's rows carrying the attribute, else all."""
            return [i for i, e in enumerate(rows) if head in e.metadata] if attribute else list(range(len(rows)))

        def gold(rows: Sequence[LabelledExample], head: str = head, attribute: bool = attribute) -> np.ndarray:
            picked = [rows[i] for i in labelled(rows)]
            return np.array([int(bool(e.metadata[head])) if attribute else int(e.label.is_positive) for e in picked])

        def probs(rows: Sequence[LabelledExample], key: tuple[str, str], h: int = h) -> np.ndarray:
            return head_probabilities(logits[key], card)[labelled(rows), h]

        if attribute:
            own = [t for t in tasks if t.valid and labelled(t.valid)]
            extra = {n: rows for n, rows in eval_rows.items() if labelled(rows)}
        else:
            own = [t for t in tasks if t.train and t.train[0].family.value == head and t.valid]
            extra = {n: rows for n, rows in eval_rows.items() if rows[0].family.value == head}
        if not own:
            continue
        valid = {t.spec.name: (gold(t.valid), probs(t.valid, (t.spec.name, "valid"))) for t in own}
        if not any(g.any() for g, _ in valid.values()):
            continue  # no positive in validation: no threshold to tune (format fixtures)
        threshold, _ = choose_threshold(valid, "macro")
        test_sets = {t.spec.name: t.test for t in own if t.test and labelled(t.test)}
        test_sets.update(extra)
        out[head] = {
            "threshold": threshold,
            "sources": sorted(test_sets),
            "test": {
                name: binary_metrics(gold(rows), probs(rows, (name, "test")), threshold)
                for name, rows in test_sets.items()
            },
        }
    return out


def evaluate_and_calibrate(
    model: torch.nn.Module,
    encoder: DialogueEncoder,
    tasks: Sequence[TaskData],
    recipe: Recipe,
    heads: list[str],
    data_dir: Path,
    metrics_path: Path,
    progress: bool = True,
    rules: LabelRules | None = None,
) -> ModelCard:
    """Fit temperatures and the threshold on valid, then measure every task/round on valid and test."""
    rules = rules or LabelRules(recipe.heads, heads, decomposed=is_decomposed(recipe))
    card = new_card(
        recipe,
        heads,
        encoding=recipe.encoding.to_dict(),
        base_model=recipe.base,
        intended_use=recipe.intended_use,
        limitations=list(recipe.limitations),
    )
    logits = {
        (t.spec.name, split): _logits_for(model, encoder, getattr(t, split), recipe, heads)
        for t in tqdm(tasks, desc="evaluate", disable=not progress)
        for split in ("valid", "test")
    }
    # temperatures: each head on the validation examples it is trained on
    temps: dict[str, float] = {}
    ece_before: dict[str, float] = {}
    ece_after: dict[str, float] = {}
    valid_targets = {t.spec.name: rules.targets(t.valid) for t in tasks if t.valid}
    for h, head in enumerate(heads):
        zs, ys = [], []
        for t in tasks:
            if not t.valid:
                continue
            y_t, m_t = valid_targets[t.spec.name]
            for i, ex in enumerate(t.valid):
                own = rules.mode != HARMONISED and _head_of(ex, heads) == h
                if own or (rules.mode == HARMONISED and m_t[i, h] > 0):
                    zs.append(logits[(t.spec.name, "valid")][i, h])
                    ys.append(float(y_t[i, h]) if rules.mode == HARMONISED else float(ex.label.is_positive))
        z, y = np.array(zs), np.array(ys)
        temps[head] = fit_temperature(z, y) if recipe.calibrate else 1.0
        if z.size:
            ece_before[head] = expected_calibration_error(y, 1 / (1 + np.exp(-z)))
            ece_after[head] = expected_calibration_error(y, 1 / (1 + np.exp(-z / temps[head])))
    card.temperatures = temps

    def scores(key: tuple[str, str]) -> np.ndarray:
        return main_scores(head_probabilities(logits[key], card), card) if logits[key].size else np.zeros(0)

    valid_sets = {}
    for t in tasks:
        if t.valid:
            gold, keep = rules.served_gold(t.valid)
            valid_sets[t.spec.name] = (gold[keep], scores((t.spec.name, "valid"))[keep])
    tuned_on = threshold_sets(valid_sets, recipe)
    if tuned_on:
        threshold, valid_f1 = choose_threshold(tuned_on, recipe.threshold_objective, recipe.false_alarm_penalty)
    else:
        threshold, valid_f1 = 0.5, {}
    card.threshold = threshold
    all_gold = np.concatenate([g for g, _ in valid_sets.values()]) if valid_sets else np.zeros(0)
    all_scores = np.concatenate([s for _, s in valid_sets.values()]) if valid_sets else np.zeros(0)
    per_source_best = {name: float(choose_threshold({name: v}, "pooled")[0]) for name, v in valid_sets.items()}
    card.calibration = {  # what was measured around card.temperatures and card.threshold (kept there, once)
        "ece_before": ece_before,
        "ece_after": ece_after,
        "ece_main_score_valid": expected_calibration_error(all_gold, all_scores) if all_gold.size else None,
        "threshold_objective": recipe.threshold_objective,
        **({"false_alarm_penalty": recipe.false_alarm_penalty} if threshold_penalty(recipe) else {}),
        "threshold_tasks": sorted(tuned_on),
        "valid_offensive_f1_at_threshold": valid_f1,
        "per_source_best_threshold": per_source_best,
    }
    metrics: dict[str, Any] = {"valid": {}, "test": {}}
    for t in tasks:
        for split in ("valid", "test"):
            rows = getattr(t, split)
            if rows:
                metrics[split][t.spec.name] = _grouped_metrics(rows, scores((t.spec.name, split)), threshold)
    eval_rows: dict[str, list[LabelledExample]] = {}
    for name in recipe.eval_sources:
        rows = [ex for ex in registry.load_source(name, data_dir) if ex.split == Split.TEST]
        if rows:
            eval_rows[name] = rows
            logits[(name, "test")] = _logits_for(model, encoder, rows, recipe, heads)
            metrics["test"][name] = _grouped_metrics(rows, scores((name, "test")), threshold)
    if len(heads) > 1:
        metrics["heads"] = _family_head_metrics(tasks, eval_rows, logits, card)
    card.metrics = metrics
    card.training = {
        "recipe": recipe.to_dict(),
        "sources": sorted({t.spec.source for t in tasks}),
        "examples": {t.spec.name: {"train": len(t.train), "valid": len(t.valid), "test": len(t.test)} for t in tasks},
        "licences": {
            s.name: s.licence for s in registry.available_sources(data_dir) if s.name in {t.spec.source for t in tasks}
        },
    }
    card.licences = dict(card.training["licences"])
    log_event(
        metrics_path, {"event": "eval", "threshold": threshold, "calibration": card.calibration, "metrics": metrics}
    )
    return card
