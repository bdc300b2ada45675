"""Functional test suites (HateCheck, HatemojiCheck, any suite in the HateCheck layout).

The cases arrive as ``LabelledExample`` objects (OFFENSIVE = hateful) whose metadata holds the
suite columns, as read by ``dialogue_safety.sources.functional``: ``functionality``, ``target`` (a
group name, a list of them, or empty) and, for HatemojiCheck-style suites, ``set``
(``original`` / ``identity`` / ``polarity`` / ``no_emoji`` perturbations) and the ids that link
a case to its perturbations (see :class:`SuiteKeys`).

Per scorer: accuracy per functionality (with n; every functionality under 50 % is flagged),
accuracy on hateful / non-hateful cases and overall; per target group accuracy, false
positive rate, false negative rate and selection rate (share predicted hateful); accuracy
per set; and the *emoji difference*: accuracy on original emoji cases minus accuracy on
their no-emoji perturbations, over the (original, no-emoji) groups whose gold label agrees
(undefined where the perturbation flips the label).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.core.scoring import is_offensive
from dialogue_safety.evaluation.baseline import gold
from dialogue_safety.evaluation.scorers import Scorer, score

FLAG_BELOW = 50.0  # percent: functionalities below this accuracy are flagged
ORIGINAL_SET = "original"
NO_EMOJI_SET = "no_emoji"
_NO_TARGET = {"", "none", "-", "nan", "null", "n/a"}


#: keys whose value is a template id ``"57.3"``: the part before the dot names the test group
TEMPLATE_KEYS: tuple[str, ...] = ("templ_id",)


@dataclass(frozen=True)
class SuiteKeys:
    """Metadata keys of a functional suite's cases.

    ``pair`` lists candidate keys whose values link an original case to its perturbations (the
    first key present in a case's metadata is used). HatemojiCheck links them through
    ``test_group_id``; its ``templ_id`` (``57.0`` original, ``57.3`` no-emoji perturbation)
    works too, by its integer part. Cases are grouped by that value and their target group, so
    one group holds the original cases of a template for one target and their perturbation.
    """

    functionality: str = "functionality"
    target: str = "target"
    set: str = "set"
    pair: tuple[str, ...] = ("test_group_id", "test_grp_id", "group_id", "pair_id", "templ_id")


def normalise_set(value: Any) -> str | None:
    """Set names of HatemojiCheck and friends in one spelling; None for no set.

    ``orig``/``original`` → ``original``; ``no_emoji_perturb``/``No emoji`` → ``no_emoji``;
    ``identity_perturb`` → ``identity``; ``polarity_perturbation`` → ``polarity``.
    """
    if value is None:
        return None
    text = "_".join(str(value).strip().lower().replace("-", " ").replace("_", " ").split())
    if text in _NO_TARGET:
        return None
    for suffix in ("_perturbation", "_perturb"):
        if text.endswith(suffix) and len(text) > len(suffix):
            text = text[: -len(suffix)]
    if text in {"orig", "original"}:
        return ORIGINAL_SET
    return NO_EMOJI_SET if text in {"no_emoji", "noemoji", "emoji_removed"} else text


def target_groups(value: Any) -> tuple[str, ...]:
    """Target groups of a case: ``"women"`` → ("women",); ``"['mus', 'arab']"`` → ("mus", "arab")."""
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = [text]
        else:
            value = [text]
    if isinstance(value, float) and np.isnan(value):
        return ()
    if not isinstance(value, list | tuple | set | frozenset):
        value = [value]
    groups = [str(v).strip() for v in value if v is not None]
    return tuple(g for g in groups if g.lower() not in _NO_TARGET)


def _pct(num: float, den: float) -> float | None:
    return 100.0 * num / den if den else None


def _group_stats(y: np.ndarray, pred: np.ndarray) -> dict[str, Any]:
    tp = int(((pred == 1) & (y == 1)).sum())
    tn = int(((pred == 0) & (y == 0)).sum())
    fp = int(((pred == 1) & (y == 0)).sum())
    fn = int(((pred == 0) & (y == 1)).sum())
    n = int(y.size)
    return {
        "n": n,
        "n_hateful": tp + fn,
        "n_non_hateful": tn + fp,
        "accuracy": _pct(tp + tn, n),
        "fpr": _pct(fp, fp + tn),
        "fnr": _pct(fn, fn + tp),
        "selection_rate": _pct(tp + fp, n),
    }


def _pair_value(case: LabelledExample, keys: SuiteKeys) -> Hashable | None:
    for key in keys.pair:
        value = case.metadata.get(key)
        if value is not None and str(value).strip() not in ("", "nan"):
            text = str(value).strip()
            if key in TEMPLATE_KEYS:
                text = text.split(".")[0]
            return text
    return None


def emoji_difference(
    cases: Sequence[LabelledExample], correct: np.ndarray, keys: SuiteKeys = SuiteKeys()
) -> dict[str, Any]:
    """Accuracy on original cases minus accuracy on their no-emoji perturbations (points).

    Cases are grouped by (pair id, target groups). A group with at least one original and one
    no-emoji case is a *pair*; if its gold labels disagree (the perturbation flips the label) it
    is *undefined* and left out. ``value`` is None when no defined pair remains.
    """
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for i, case in enumerate(cases):
        pair = _pair_value(case, keys)
        kind = normalise_set(case.metadata.get(keys.set))
        if pair is not None and kind in (ORIGINAL_SET, NO_EMOJI_SET):
            groups[(pair, target_groups(case.metadata.get(keys.target)))].append(i)
    original: list[int] = []
    no_emoji: list[int] = []
    n_pairs = n_undefined = 0
    for members in groups.values():
        kinds = {normalise_set(cases[i].metadata.get(keys.set)) for i in members}
        if kinds != {ORIGINAL_SET, NO_EMOJI_SET}:
            continue
        n_pairs += 1
        if len({cases[i].label for i in members}) > 1:
            n_undefined += 1
            continue
        for i in members:
            (original if normalise_set(cases[i].metadata.get(keys.set)) == ORIGINAL_SET else no_emoji).append(i)
    result: dict[str, Any] = {
        "n_pairs": n_pairs,
        "n_undefined": n_undefined,
        "n_original": len(original),
        "n_no_emoji": len(no_emoji),
        "original_accuracy": _pct(float(correct[original].sum()), len(original)) if original else None,
        "no_emoji_accuracy": _pct(float(correct[no_emoji].sum()), len(no_emoji)) if no_emoji else None,
    }
    if n_pairs == 0:
        result["value"] = None
        result["reason"] = f"no original/no-emoji pairs linked by {' or '.join(keys.pair)}"
    elif n_pairs == n_undefined:
        result["value"] = None
        result["reason"] = "undefined: every no-emoji perturbation flips the label"
    else:
        result["value"] = result["original_accuracy"] - result["no_emoji_accuracy"]
        result["reason"] = None
    return result


def _functionality_label(y: np.ndarray) -> str:
    if y.all():
        return "hateful"
    if not y.any():
        return "non-hateful"
    return "mixed"


def functional_scores(
    cases: Sequence[LabelledExample], probs: np.ndarray, threshold: float, keys: SuiteKeys = SuiteKeys()
) -> dict[str, Any]:
    """All functional-suite numbers for one scorer's probabilities."""
    y = gold(cases)
    pred = is_offensive(np.asarray(probs), threshold).astype(int)
    correct = pred == y
    by_func: dict[str, list[int]] = defaultdict(list)
    by_target: dict[str, list[int]] = defaultdict(list)
    by_set: dict[str, list[int]] = defaultdict(list)
    for i, case in enumerate(cases):
        by_func[str(case.metadata.get(keys.functionality) or "(none)")].append(i)
        for group in target_groups(case.metadata.get(keys.target)):
            by_target[group].append(i)
        kind = normalise_set(case.metadata.get(keys.set))
        if kind is not None:
            by_set[kind].append(i)
    functionalities = []
    for name, idx in by_func.items():
        acc = _pct(float(correct[idx].sum()), len(idx))
        functionalities.append(
            {
                "functionality": name,
                "gold": _functionality_label(y[idx]),
                "n": len(idx),
                "accuracy": acc,
                "below_50": acc is not None and acc < FLAG_BELOW,
            }
        )
    hateful, non_hateful = y == 1, y == 0
    out: dict[str, Any] = {
        "threshold": float(threshold),
        "overall": {"n": int(y.size), "accuracy": _pct(float(correct.sum()), y.size)},
        "hateful": {"n": int(hateful.sum()), "accuracy": _pct(float(correct[hateful].sum()), hateful.sum())},
        "non_hateful": {
            "n": int(non_hateful.sum()),
            "accuracy": _pct(float(correct[non_hateful].sum()), non_hateful.sum()),
        },
        "functionalities": functionalities,
        "flagged": [f["functionality"] for f in functionalities if f["below_50"]],
        "targets": [{"target": group} | _group_stats(y[idx], pred[idx]) for group, idx in sorted(by_target.items())],
        "sets": (
            [
                {"set": name, "n": len(idx), "accuracy": _pct(float(correct[idx].sum()), len(idx))}
                for name, idx in by_set.items()
            ]
            if by_set
            else None
        ),
    }
    if by_set:
        per_func = {}
        for name, idx in by_func.items():
            diff = emoji_difference([cases[i] for i in idx], correct[idx], keys)
            if diff["n_pairs"]:
                per_func[name] = diff
        out["emoji_difference"] = {"overall": emoji_difference(cases, correct, keys), "functionalities": per_func}
    else:
        out["emoji_difference"] = None
    return out


def evaluate_functional(
    suite: str,
    cases: Sequence[LabelledExample],
    scorers: Mapping[str, Scorer],
    keys: SuiteKeys = SuiteKeys(),
) -> dict[str, Any]:
    """Score a functional suite with every scorer (keyed by role, e.g. model/baseline)."""
    if not cases:
        raise ValueError(f"functional suite {suite!r} has no cases")
    missing = sum(1 for c in cases if keys.functionality not in c.metadata)
    if missing == len(cases):
        raise ValueError(
            f"functional suite {suite!r}: no case has metadata {keys.functionality!r}; "
            "was it read with the suite's column mapping?"
        )
    result: dict[str, Any] = {"suite": suite, "n": len(cases), "scorers": {}}
    for role, scorer in scorers.items():
        probs = score(scorer, cases, desc=suite)
        result["scorers"][role] = functional_scores(cases, probs, float(scorer.threshold), keys)
    return result
