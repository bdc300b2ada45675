"""The periodic validation check and keep-best's selection score (``eval_every``, ``keep_best``).

Each check scores the served OFFENSIVE score (uncalibrated) on the valid splits, at the threshold the recipe's
objective would pick there (``dialogue_safety.training.calibration.choose_threshold``); it never looks at a test split.
With ``general_recall_floors`` it also measures the recall of the guarded general-text sets there, and the selection
score pays for each point below a floor (``dialogue_safety.training.calibration.RecallFloors``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample
from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.core.scoring import head_probabilities, is_offensive, main_scores
from dialogue_safety.training.calibration import RecallFloors, choose_threshold, false_alarm_cost, safe_only
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
    floors = recall_floors(recipe)
    check = score_valid_sets(
        threshold_sets(valid_sets, recipe),
        threshold_penalty(recipe),
        floors,
        guarded_sets(valid_sets, recipe),
        threshold_floors(recipe),
    )
    return {**check, "selection": selection_score(check, recipe.false_alarm_penalty, floors)}


def selection_score(check: dict[str, Any], false_alarm_penalty: float, floors: RecallFloors | None = None) -> float:
    """What keep-best maximises: the macro OFFENSIVE-F1 less ``false_alarm_penalty`` points per point (%)
    flagged of the SAFE-only validation sets (their mean; nothing when there are none), less the general-moderation
    guard's cost of the check's ``general_recall`` (``floors``: the recipe's ``general_recall_floors``)."""
    guard = floors.cost(check.get("general_recall", {})) if floors is not None else 0.0
    return float(
        check["macro_f1"] - false_alarm_cost(list(check.get("flagged_rate", {}).values()), false_alarm_penalty) - guard
    )


def improves_on(check: dict[str, Any], best: dict[str, Any]) -> bool:
    """Whether keep-best takes this check over ``best`` (the best so far): a higher ``selection`` score, so a check
    that gains macro F1 by losing general-moderation recall below its floors is not taken when the guard's cost
    outweighs the gain. A state saved before the selection score existed holds the macro F1 only (the same number
    without penalties)."""
    return bool(check["selection"] > best.get("selection", best["macro_f1"]))


def threshold_penalty(recipe: Recipe) -> float:
    """The false-alarm penalty the threshold is chosen with: the recipe's under the ``selection`` objective
    (the periodic check then scores each checkpoint at the threshold it would ship with), else none."""
    return recipe.false_alarm_penalty if recipe.threshold_objective == "selection" else 0.0


def recall_floors(recipe: Recipe) -> RecallFloors | None:
    """The recipe's general-moderation guard (``general_recall_floors``), or None without one."""
    if not recipe.general_recall_floors:
        return None
    return RecallFloors(dict(recipe.general_recall_floors), recipe.general_recall_penalty)


def threshold_floors(recipe: Recipe) -> RecallFloors | None:
    """The guard the threshold is chosen with: the recipe's under the ``selection`` objective, else none
    (like ``threshold_penalty``)."""
    return recall_floors(recipe) if recipe.threshold_objective == "selection" else None


def guarded_sets(valid_sets: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    """The validation sets the general-moderation guard measures recall on (``recipe.general_recall_floors``)."""
    return {name: v for name, v in valid_sets.items() if name in recipe.general_recall_floors}


def threshold_sets(valid_sets: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    """The validation sets the threshold is tuned on (``recipe.threshold_tasks``; all when empty)."""
    if not recipe.threshold_tasks:
        return valid_sets
    return {name: v for name, v in valid_sets.items() if name in recipe.threshold_tasks}


def score_valid_sets(
    valid_sets: dict[str, tuple[np.ndarray, np.ndarray]],
    false_alarm_penalty: float = 0.0,
    floors: RecallFloors | None = None,
    guarded: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    floors_for_threshold: RecallFloors | None = None,
) -> dict[str, Any]:
    """The periodic check's numbers from (served gold, served score) per source: OFFENSIVE-F1 per
    source at the macro-best threshold (less ``false_alarm_penalty`` points per point flagged of the
    sources without positives when it is set, and the cost of ``floors_for_threshold`` on the ``guarded`` sets:
    the ``selection`` objective), their mean, for sources without positives the share flagged, and with
    ``floors`` the recall (%) of the ``guarded`` sets there (``general_recall``) and its shortfall in points."""
    if not valid_sets:
        return {"macro_f1": 0.0, "threshold": 0.5, "offensive_f1": {}}
    threshold, per_source = choose_threshold(
        valid_sets, "selection", false_alarm_penalty, floors_for_threshold, guarded
    )
    # sources with no positives (written SAFE sets) have no F1: how many of them the model flags instead
    flagged = {
        name: float(np.mean(is_offensive(scores, threshold))) for name, (_, scores) in safe_only(valid_sets).items()
    }
    guard: dict[str, Any] = {}
    if floors is not None:
        recall = floors.recall(guarded or {}, threshold)
        guard = {"general_recall": recall, "general_shortfall": float(floors.shortfall(recall))}
    return {
        "macro_f1": float(np.mean(list(per_source.values()))),
        "threshold": threshold,
        "offensive_f1": per_source,
        **({"flagged_rate": flagged} if flagged else {}),
        **guard,
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
