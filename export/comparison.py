"""How much a variant changes the classifier: OFFENSIVE-F1 and decisions against fp32, per test split.

    from export.comparison import compare_variants, choose_cpu_variant
    report = compare_variants("models/default", {"diasafety/test": examples, "convabuse/test": more})
    variant, reason = choose_cpu_variant(report, ["fp32", "optimized", "int8"])

int8 becomes the CPU default when it is good enough *by quality*: no split loses more than
``max_f1_drop`` OFFENSIVE-F1 points against fp32 and the mean ΔF1 over the splits is not negative
(a gain is not a failure); otherwise optimized (same rule), otherwise fp32. The report also gives
each split's decision agreement with fp32 (``1 - changed_decisions``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime import CPU, OnnxClassifier
from service.schema import LabelledExample
from service.scoring import head_probabilities, is_offensive, main_scores
from training.metrics import binary_metrics

REFERENCE = "fp32"


def compare_variants(
    model_dir: str | Path,
    test_sets: Mapping[str, Sequence[LabelledExample]],
    variant_names: Sequence[str] = ("fp32", "optimized", "int8"),
    *,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Score every split with every variant (CPU) and compare each with fp32.

    Returns ``{"reference", "threshold", "splits": {split: {n, positives}}, "variants": {variant:
    {split: {offensive_f1, delta_f1, changed_decisions, max_abs_score_diff}}}, "seconds": {variant: s}}``
    with F1 in percent and ``changed_decisions`` as a fraction of the split.
    """
    names = [REFERENCE, *[v for v in variant_names if v != REFERENCE]]
    splits = {name: list(examples) for name, examples in test_sets.items() if len(examples)}
    if not splits:
        raise ValueError("compare_variants needs at least one non-empty test split")
    gold = {s: np.array([ex.label.is_positive for ex in exs], dtype=int) for s, exs in splits.items()}
    encoded: dict[str, list[Any]] = {}
    scores: dict[str, dict[str, np.ndarray]] = {}
    seconds: dict[str, float] = {}
    t: float | None = threshold
    for variant in names:
        clf = OnnxClassifier(model_dir, variant=variant, providers=[CPU])
        t = clf.card.threshold if threshold is None else float(threshold)
        if not encoded:
            encoded = {s: clf.encode(exs) for s, exs in splits.items()}
        started = time.perf_counter()
        scores[variant] = {
            s: main_scores(head_probabilities(clf.logits_encoded(enc), clf.card), clf.card)
            for s, enc in encoded.items()
        }
        seconds[variant] = round(time.perf_counter() - started, 3)
    assert t is not None
    report: dict[str, Any] = {
        "reference": REFERENCE,
        "threshold": t,
        "splits": {s: {"n": int(g.size), "positives": int(g.sum())} for s, g in gold.items()},
        "variants": {},
        "seconds": seconds,
    }
    for variant in names:
        per_split: dict[str, Any] = {}
        for s in splits:
            ref, got = scores[REFERENCE][s], scores[variant][s]
            ref_f1 = binary_metrics(gold[s], ref, t)["offensive_f1"]
            f1 = binary_metrics(gold[s], got, t)["offensive_f1"]
            per_split[s] = {
                "offensive_f1": round(f1, 3),
                "delta_f1": round(f1 - ref_f1, 3),
                "changed_decisions": round(float(np.mean(is_offensive(got, t) != is_offensive(ref, t))), 5),
                "max_abs_score_diff": float(np.max(np.abs(got - ref))),
            }
        report["variants"][variant] = per_split
    return report


def within(report: Mapping[str, Any], variant: str, max_f1_drop: float) -> tuple[bool, float, float]:
    """Whether ``variant`` passes the quality rule; its worst ΔF1 (most negative) and mean ΔF1."""
    per_split = report["variants"].get(variant)
    if not per_split:
        return False, float("-inf"), float("-inf")
    deltas = [float(v["delta_f1"]) for v in per_split.values()]
    worst, mean = min(deltas), float(np.mean(deltas))
    return worst >= -max_f1_drop and mean >= 0.0, worst, mean


def choose_cpu_variant(
    report: Mapping[str, Any] | None, candidates: Sequence[str], *, max_f1_drop: float = 0.5
) -> tuple[str, str]:
    """The CPU default and why: int8 if validated within ``max_f1_drop``, else optimized, else fp32."""
    fallback = "optimized" if "optimized" in candidates else "fp32"
    if report is None:
        if "int8" in candidates:
            return fallback, "int8 not validated (no labelled test sets at export); CPU default is " + fallback
        return fallback, f"CPU default is {fallback} (int8 not exported)"
    for variant in ("int8", "optimized"):
        if variant not in candidates:
            continue
        ok, worst, mean = within(report, variant, max_f1_drop)
        if ok:
            return variant, (
                f"{variant}: worst ΔF1 vs fp32 {worst:+.2f} (no split loses more than {max_f1_drop} points), "
                f"mean ΔF1 {mean:+.2f} >= 0"
            )
    reasons = []
    for variant in ("int8", "optimized"):
        if variant in candidates:
            _, worst, mean = within(report, variant, max_f1_drop)
            reasons.append(f"{variant} worst ΔF1 {worst:+.2f}, mean {mean:+.2f}")
    return "fp32", f"fp32: {'; '.join(reasons)} (rule: worst >= -{max_f1_drop}, mean >= 0)"
