"""How much a variant changes the classifier: OFFENSIVE-F1 and decisions against fp32, per test split.

    from dialogue_safety.export.comparison import compare_variants, choose_cpu_variant
    report = compare_variants("models/default", {"diasafety/test": examples, "convabuse/test": more})
    variant, reason = choose_cpu_variant(report, ["fp32", "optimized", "int8"])

The gate judges a variant on what users see and on what the test sets can resolve: per split the
**decision agreement** with fp32 and the OFFENSIVE-F1 difference with a **paired bootstrap 95 %
interval** (the same resampled items scored by both models, :data:`RESAMPLES` resamples, seeded).
A variant passes when it agrees with fp32 on at least :data:`MIN_AGREEMENT` of the items of every
split, the mean ΔF1 over the splits is at least :data:`MIN_MEAN_DELTA_F1`, and no split's interval
lies entirely below :data:`CI_FLOOR` (a loss the test set shows beyond resampling noise). A split
of ~130 positives moves its F1 by ~0.4 points per changed decision, so a fixed "no split loses
more than 0.5" rule failed on two or three decisions. int8 becomes the CPU default when it
passes, otherwise optimized (same gate), otherwise fp32.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.runtime import CPU, OnnxClassifier
from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.core.scoring import is_offensive
from dialogue_safety.training.metrics import binary_metrics

REFERENCE = "fp32"
MIN_AGREEMENT = 0.99  # decisions the same as fp32 on every split
MIN_MEAN_DELTA_F1 = -0.3  # mean ΔF1 (points) over the splits
CI_FLOOR = -0.5  # no split's 95 % interval of ΔF1 entirely below this
RESAMPLES = 1000
SEED = 0


def _f1(gold: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """OFFENSIVE-F1 in percent along the last axis of boolean arrays (0 where there is nothing to find
    and nothing flagged)."""
    tp, fp, fn = (gold & pred).sum(-1), (~gold & pred).sum(-1), (gold & ~pred).sum(-1)
    denom = 2 * tp + fp + fn
    return np.where(denom > 0, 100.0 * 2 * tp / np.maximum(denom, 1), 0.0)


def paired_bootstrap_delta_f1(
    gold: np.ndarray, reference: np.ndarray, variant: np.ndarray, resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, float]:
    """ΔF1 (variant − reference, points) on the items and its paired bootstrap 95 % interval.

    ``gold``, ``reference`` and ``variant`` are 0/1 arrays over the same items; every resample draws
    the same item indices for both models, so the interval reflects their disagreement only.
    """
    g, r, v = (np.asarray(a, dtype=bool) for a in (gold, reference, variant))
    n = g.size
    if n == 0:
        raise ValueError("paired_bootstrap_delta_f1 needs at least one item")
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    deltas = _f1(g[idx], v[idx]) - _f1(g[idx], r[idx])
    point = float(_f1(g, v) - _f1(g, r))
    lo, hi = np.percentile(deltas, [2.5, 97.5])
    return {"delta_f1": point, "ci_low": float(lo), "ci_high": float(hi), "bootstrap_mean": float(deltas.mean())}


def score_variants(
    model_dir: str | Path,
    splits: Mapping[str, Sequence[LabelledExample]],
    variant_names: Sequence[str],
    *,
    int8_check: bool = True,
    passes: int = 1,
) -> tuple[dict[str, dict[str, np.ndarray]], float, dict[str, float]]:
    """({variant: {split: main scores}}, the card's threshold, {variant: seconds}), CPU; the examples
    are encoded once. ``int8_check=False`` scores int8 without the card's fp32 check near the threshold.
    ``passes`` > 1 scores each variant that many times and reports the fastest pass (the first one
    includes the session's warm-up)."""
    encoded: dict[str, list[Any]] = {}
    scores: dict[str, dict[str, np.ndarray]] = {}
    seconds: dict[str, float] = {}
    threshold = 0.5
    for variant in variant_names:
        clf = OnnxClassifier(model_dir, variant=variant, providers=[CPU], int8_check=int8_check)
        threshold = clf.card.threshold
        if not encoded:
            encoded = {s: clf.encode(exs) for s, exs in splits.items()}
        timings = []
        for _ in range(max(1, passes)):
            started = time.perf_counter()
            scores[variant] = {s: clf.scores_encoded(enc) for s, enc in encoded.items()}
            timings.append(time.perf_counter() - started)
        seconds[variant] = round(min(timings), 3)
    return scores, threshold, seconds


def compare_split(gold: np.ndarray, reference: np.ndarray, scores: np.ndarray, threshold: float) -> dict[str, Any]:
    """One split's numbers for the gate: OFFENSIVE-F1, ΔF1 against the reference with its paired
    bootstrap interval, the fraction of changed decisions, the largest score difference."""
    ref_f1 = binary_metrics(gold, reference, threshold)["offensive_f1"]
    f1 = binary_metrics(gold, scores, threshold)["offensive_f1"]
    boot = paired_bootstrap_delta_f1(gold, is_offensive(reference, threshold), is_offensive(scores, threshold))
    return {
        "offensive_f1": round(f1, 3),
        "delta_f1": round(f1 - ref_f1, 3),
        "delta_f1_ci": [round(boot["ci_low"], 3), round(boot["ci_high"], 3)],
        "changed_decisions": round(
            float(np.mean(is_offensive(scores, threshold) != is_offensive(reference, threshold))), 5
        ),
        "max_abs_score_diff": float(np.max(np.abs(scores - reference))),
    }


def gold_labels(splits: Mapping[str, Sequence[LabelledExample]]) -> dict[str, np.ndarray]:
    return {s: np.array([ex.label.is_positive for ex in exs], dtype=int) for s, exs in splits.items()}


def compare_variants(
    model_dir: str | Path,
    test_sets: Mapping[str, Sequence[LabelledExample]],
    variant_names: Sequence[str] = ("fp32", "optimized", "int8"),
    *,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Score every split with every variant (CPU; int8 as it serves, with the card's fp32 check near
    the threshold) and compare each with fp32.

    Returns ``{"reference", "threshold", "splits": {split: {n, positives}}, "variants": {variant:
    {split: {offensive_f1, delta_f1, changed_decisions, max_abs_score_diff}}}, "seconds": {variant: s}}``
    with F1 in percent and ``changed_decisions`` as a fraction of the split.
    """
    names = [REFERENCE, *[v for v in variant_names if v != REFERENCE]]
    splits = {name: list(examples) for name, examples in test_sets.items() if len(examples)}
    if not splits:
        raise ValueError("compare_variants needs at least one non-empty test split")
    gold = gold_labels(splits)
    scores, card_threshold, seconds = score_variants(model_dir, splits, names)
    t = card_threshold if threshold is None else float(threshold)
    report: dict[str, Any] = {
        "reference": REFERENCE,
        "threshold": t,
        "splits": {s: {"n": int(g.size), "positives": int(g.sum())} for s, g in gold.items()},
        "variants": {},
        "seconds": seconds,
    }
    for variant in names:
        per_split = {s: compare_split(gold[s], scores[REFERENCE][s], scores[variant][s], t) for s in splits}
        report["variants"][variant] = per_split
        report.setdefault("gate", {})[variant] = gate(per_split)
    report["gate_rule"] = {
        "min_agreement": MIN_AGREEMENT,
        "min_mean_delta_f1": MIN_MEAN_DELTA_F1,
        "ci_floor": CI_FLOOR,
        "resamples": RESAMPLES,
        "seed": SEED,
    }
    return report


def gate(per_split: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Whether a variant passes (see the module docstring), with the numbers that decided it."""
    agreement = {s: 1.0 - float(v["changed_decisions"]) for s, v in per_split.items()}
    mean = float(np.mean([float(v["delta_f1"]) for v in per_split.values()]))
    below = sorted(s for s, v in per_split.items() if float(v["delta_f1_ci"][1]) < CI_FLOOR)
    low_agreement = sorted(s for s, a in agreement.items() if a < MIN_AGREEMENT)
    reasons = []
    if low_agreement:
        worst = min(agreement.values())
        reasons.append(f"agreement {100 * worst:.2f} % < {100 * MIN_AGREEMENT:.0f} % on {', '.join(low_agreement)}")
    if mean < MIN_MEAN_DELTA_F1:
        reasons.append(f"mean ΔF1 {mean:+.2f} < {MIN_MEAN_DELTA_F1}")
    if below:
        reasons.append(f"ΔF1 interval entirely below {CI_FLOOR} on {', '.join(below)}")
    return {
        "passed": not reasons,
        "min_agreement": min(agreement.values()),
        "mean_delta_f1": mean,
        "splits_below_floor": below,
        "why": "; ".join(reasons) if reasons else "passes",
    }


def choose_cpu_variant(report: Mapping[str, Any] | None, candidates: Sequence[str]) -> tuple[str, str]:
    """The CPU default and why: the fastest of the candidates that pass the gate (fp32, the reference,
    always does), by the seconds each took to score the same test splits in ``report`` (int8 with its
    check). Without timings: int8 if it passes, else optimized, else fp32. Without a report: optimized
    (int8 is not validated)."""
    fallback = "optimized" if "optimized" in candidates else "fp32"
    if report is None:
        if "int8" in candidates:
            return fallback, "int8 not validated (no labelled test sets at export); CPU default is " + fallback
        return fallback, f"CPU default is {fallback} (int8 not exported)"
    gates = report.get("gate", {})
    passing = [v for v in candidates if v == REFERENCE or (v in gates and gates[v]["passed"])]
    failing = [f"{v}: {gates[v]['why']}" for v in candidates if v not in passing and v in gates]
    seconds = report.get("seconds") or {}
    if passing and all(v in seconds for v in passing):
        chosen = min(passing, key=lambda v: (float(seconds[v]), passing.index(v)))
        timings = ", ".join(f"{v} {float(seconds[v]):.1f} s" for v in passing)
        g = gates.get(chosen, {})
        quality = (
            f"agreement with fp32 >= {100 * g['min_agreement']:.2f} % on every split, mean ΔF1 "
            f"{g['mean_delta_f1']:+.2f}"
            if chosen != REFERENCE and g
            else "the reference"
        )
        why = f"{chosen}: the fastest variant that passes the gate ({quality}); scoring the test splits took {timings}"
        return chosen, why + (f"; failed: {'; '.join(failing)}" if failing else "")
    for variant in ("int8", "optimized"):
        if variant in candidates and variant in gates and gates[variant]["passed"]:
            g = gates[variant]
            return variant, (
                f"{variant} passes the gate: agreement with fp32 >= {100 * g['min_agreement']:.2f} % on every split, "
                f"mean ΔF1 {g['mean_delta_f1']:+.2f}, no split's interval below {CI_FLOOR}"
            )
    return "fp32", f"fp32: {'; '.join(failing)}"


def passing_variants(report: Mapping[str, Any] | None, candidates: Sequence[str]) -> list[str]:
    """The candidates that pass the gate in ``report`` (fp32, the reference, always), in their order: the card's
    ``cpu_candidates``, among which the runtime picks per CPU family. Without a report: the fallback
    :func:`choose_cpu_variant` names (nothing else was judged)."""
    if report is None:
        return [choose_cpu_variant(None, candidates)[0]]
    gates = report.get("gate", {})
    return [v for v in candidates if v == REFERENCE or (v in gates and gates[v]["passed"])]


def speed_figures(report: Mapping[str, Any] | None, variants: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{variant: {"dialogues_per_s": ...}}`` from the seconds each of ``variants`` took to score the test splits
    of ``report`` (batched, int8 with its check): the export machine's figures for the card's ``cpu_speed``."""
    if report is None:
        return {}
    seconds = report.get("seconds") or {}
    n = sum(int(split["n"]) for split in (report.get("splits") or {}).values())
    return {v: {"dialogues_per_s": round(n / float(seconds[v]), 1)} for v in variants if seconds.get(v) and n}
