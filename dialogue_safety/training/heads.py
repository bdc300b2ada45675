"""The head layout of a recipe, and how examples become per-head targets and the served score's gold.

``heads`` in the recipe picks the layout (``shared``, ``per_family``, ``hierarchical``, ``harmonised``); a
decomposed model (``encoding.context_mode = "decomposed"``) reads the context head from the dialogue and the
other heads from the utterance alone, so each example trains on one or two rows (``training_rows``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.training.harmonise import (
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
from dialogue_safety.training.mixture import TaskData
from dialogue_safety.training.recipe import Recipe


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


def head_of(ex: LabelledExample, heads: list[str]) -> int:
    return 0 if len(heads) == 1 else heads.index(ex.family.value)
