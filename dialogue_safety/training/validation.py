"""The periodic validation check and keep-best's selection score (``eval_every``, ``keep_best``).

Each check scores the served OFFENSIVE score (uncalibrated) on the valid splits, at the threshold the recipe's
objective would pick there (``dialogue_safety.training.calibration.choose_threshold``); it never looks at a test split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample
from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.core.scoring import head_probabilities, is_offensive, main_scores
from dialogue_safety.training.calibration import choose_threshold, false_alarm_cost, safe_only
from dialogue_safety.training.heads import LabelRules, context_heads, is_decomposed, new_card
from dialogue_safety.training.inference import num_labels, predict_logits
from dialogue_safety.training.mixture import TaskData
from dialogue_safety.training.recipe import Recipe


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
            z = logits_for(model, encoder, t.valid, recipe, heads)
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


def logits_for(
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
