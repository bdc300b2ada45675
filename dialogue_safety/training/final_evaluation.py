"""The run's closing evaluation: temperatures and the threshold fitted on valid, every task measured on valid and test.

What it finds goes into the model card (``temperatures``, ``threshold``, ``calibration``, ``metrics``, ``training``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dialogue_safety.core.encoding import DialogueEncoder
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import LabelledExample, Split
from dialogue_safety.core.scoring import head_probabilities, main_scores
from dialogue_safety.sources import registry
from dialogue_safety.training.calibration import choose_threshold, fit_temperature
from dialogue_safety.training.harmonise import ATTRIBUTE_HEADS, HARMONISED
from dialogue_safety.training.heads import LabelRules, head_of, is_decomposed, new_card
from dialogue_safety.training.metrics import binary_metrics, expected_calibration_error
from dialogue_safety.training.mixture import TaskData
from dialogue_safety.training.recipe import Recipe
from dialogue_safety.training.run_dir import log_event
from dialogue_safety.training.validation import (
    guarded_sets,
    logits_for,
    recall_floors,
    threshold_floors,
    threshold_penalty,
    threshold_sets,
)


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
        (t.spec.name, split): logits_for(model, encoder, getattr(t, split), recipe, heads)
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
                own = rules.mode != HARMONISED and head_of(ex, heads) == h
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
        threshold, valid_f1 = choose_threshold(
            tuned_on,
            recipe.threshold_objective,
            recipe.false_alarm_penalty,
            threshold_floors(recipe),
            guarded_sets(valid_sets, recipe),
        )
    else:
        threshold, valid_f1 = 0.5, {}
    card.threshold = threshold
    all_gold = np.concatenate([g for g, _ in valid_sets.values()]) if valid_sets else np.zeros(0)
    all_scores = np.concatenate([s for _, s in valid_sets.values()]) if valid_sets else np.zeros(0)
    floors = recall_floors(recipe)
    guard_record: dict[str, Any] = {}
    if floors is not None:  # the general-moderation guard: its floors and the valid recall at the card's threshold
        recall = floors.recall(guarded_sets(valid_sets, recipe), threshold)
        guard_record = {
            "general_recall_floors": dict(floors.floors),
            "general_recall_penalty": floors.penalty,
            "general_recall_at_threshold": recall,
            "general_shortfall": float(floors.shortfall(recall)),
        }
    per_source_best = {name: float(choose_threshold({name: v}, "pooled")[0]) for name, v in valid_sets.items()}
    card.calibration = {  # what was measured around card.temperatures and card.threshold (kept there, once)
        "ece_before": ece_before,
        "ece_after": ece_after,
        "ece_main_score_valid": expected_calibration_error(all_gold, all_scores) if all_gold.size else None,
        "threshold_objective": recipe.threshold_objective,
        **({"false_alarm_penalty": recipe.false_alarm_penalty} if threshold_penalty(recipe) else {}),
        "threshold_tasks": sorted(tuned_on),
        **guard_record,
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
            logits[(name, "test")] = logits_for(model, encoder, rows, recipe, heads)
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
