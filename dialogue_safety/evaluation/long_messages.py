"""Long messages: is an offensive utterance still caught inside a long harmless text?

Built from test splits only. Each offensive test utterance (OLID and ConvAbuse by default, a seeded
sample per source) is embedded in harmless text made of *other* harmless test utterances of the
same sources (whole utterances, seeded order), filled up to ``total_chars`` characters in all
(4,000 by default, the API's limit per utterance), at the start, in the middle (at the part
boundary nearest the middle), at the end and at a random part boundary. Reported per scorer:

* **recall** of the utterances alone and at each position (at the scorer's own threshold), and the
  headline: the **worst drop** in points of an embedded position below alone. The filler of these
  *quiet* texts is made only of the harmless utterances the first scorer scores SAFE alone, so a
  catch is the utterance's; the share of quiet texts flagged *without* the utterance is reported
  too, and the recall again over the utterances whose quiet text is not flagged on its own;
* the flagged rate of *gold* long harmless texts (any harmless test utterance) beside the flagged
  rate of their **parts scored alone** (each part, and the share of texts with at least one part
  flagged alone): reading a long text in windows and taking the maximum flags a text when one of
  its windows looks offensive.

Run it with ``dialogue-safety evaluate MODEL --suite long_messages`` (docs/evaluation.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dialogue_safety.core.schema import UTTERANCE_UNLABELLED, Example, LabelledExample, Split
from dialogue_safety.core.scoring import is_offensive
from dialogue_safety.evaluation.sampling import subsample
from dialogue_safety.evaluation.scorers import Scorer, score

SOURCES: tuple[str, ...] = ("olid", "convabuse")
PER_SOURCE = 100  # offensive utterances per source (seeded sample)
TOTAL_CHARS = 4000  # characters of a long text in all (the API's SAFETY_MAX_UTTERANCE_CHARS)
POSITIONS: tuple[str, ...] = ("start", "middle", "end", "random")
SEPARATOR = " "

SplitGetter = Callable[[str, Split], list[LabelledExample]]


def _utterances(rows: Sequence[LabelledExample], positive: bool) -> list[LabelledExample]:
    """Test items judged on their utterance (not replies labelled only in their context)."""
    return [ex for ex in rows if ex.label.is_positive == positive and not ex.metadata.get(UTTERANCE_UNLABELLED)]


def filler(parts: Sequence[str], chars: int, rng: np.random.Generator) -> list[str]:
    """Harmless parts in a seeded order, whole, until adding the next would pass ``chars`` in all."""
    out: list[str] = []
    used = 0
    for i in rng.permutation(len(parts)):
        part = parts[int(i)]
        extra = len(part) + (len(SEPARATOR) if out else 0)
        if used + extra > chars:
            if used >= chars * 0.9:
                break
            continue
        out.append(part)
        used += extra
    return out


def embed(utterance: str, parts: Sequence[str], position: str, rng: np.random.Generator) -> str:
    """``utterance`` put among ``parts`` (at a part boundary) at ``position``."""
    at = {"start": 0, "end": len(parts), "middle": len(parts) // 2}.get(position)
    if at is None:
        at = int(rng.integers(0, len(parts) + 1))
    return SEPARATOR.join([*parts[:at], utterance, *parts[at:]])


def build_probes(
    get: SplitGetter,
    seed: int = 0,
    per_source: int = PER_SOURCE,
    sources: Sequence[str] = SOURCES,
    split: Split = Split.TEST,
) -> dict[str, Any]:
    """The offensive test utterances (a seeded sample per source) and the harmless test utterances
    of the same sources that long texts are made of (``split``: the validation splits for
    :func:`compare_window_rules`)."""
    offensive: list[LabelledExample] = []
    harmless: list[str] = []
    for name in sources:
        rows = get(name, split)
        offensive += subsample(_utterances(rows, True), per_source, seed)
        harmless += sorted({ex.utterance.strip() for ex in _utterances(rows, False) if ex.utterance.strip()})
    return {"offensive": offensive, "harmless": harmless, "seed": seed}


def evaluate_long_messages(
    probes: Mapping[str, Any], scorers: Mapping[str, Scorer], total_chars: int = TOTAL_CHARS
) -> dict[str, Any]:
    """Recall of the offensive utterances alone and embedded, and the flagged rates of long harmless
    texts (see the module docstring).

    Two kinds of long harmless text, one per offensive utterance, of ``total_chars`` in all with it:
    **quiet** texts are made of the harmless utterances that the first scorer (``model``) scores
    below its threshold alone, so that the recall at each position measures the utterance, not
    false alarms of the filler (the offensive utterances are embedded in these); **gold** texts of
    any harmless test utterance, whose flagged rate is reported beside that of their parts alone.
    """
    offensive: list[LabelledExample] = probes["offensive"]
    harmless: list[str] = probes["harmless"]
    out: dict[str, Any] = {"n_offensive": len(offensive), "sources": sorted({ex.source for ex in offensive})}
    if not offensive or not harmless or not scorers:
        out["scorers"] = {}
        return out
    first = next(iter(scorers.values()))
    alone_scores = score(first, [Example(utterance=x) for x in harmless], "long: harmless parts")
    quiet = [x for x, q in zip(harmless, is_offensive(alone_scores, first.threshold), strict=True) if not q]
    quiet_parts, gold_parts, texts = collages(offensive, quiet, harmless, int(probes.get("seed", 0)), total_chars)
    out.update(
        chars=_stats([len(t) for t in texts["end"]]),
        harmless_utterances=len(harmless),
        quiet_utterances=len(quiet),
        parts_per_text=_stats([len(p) for p in gold_parts]),
        scorers={},
    )
    flat_gold = [x for p in gold_parts for x in p]
    starts = np.cumsum([0] + [len(p) for p in gold_parts[:-1]])
    for role, scorer in scorers.items():
        t = scorer.threshold
        alone = is_offensive(score(scorer, [ex.as_example() for ex in offensive], "long: alone"), t)
        quiet_long = score(scorer, [Example(utterance=SEPARATOR.join(p)) for p in quiet_parts], "long: quiet texts")
        silent = ~is_offensive(quiet_long, t)  # the filler alone is not flagged: a catch is the utterance's
        row: dict[str, Any] = {
            "threshold": t,
            "recall_alone": float(alone.mean()),
            "n_filler_safe": int(silent.sum()),
            "recall_alone_filler_safe": float(alone[silent].mean()) if silent.any() else None,
        }
        drops, drops_silent = [], []
        for position in POSITIONS:
            scores = score(scorer, [Example(utterance=x) for x in texts[position]], f"long: {position}")
            caught = is_offensive(scores, t)
            row[f"recall_{position}"] = float(caught.mean())
            drops.append(row["recall_alone"] - row[f"recall_{position}"])
            if silent.any():
                row[f"recall_{position}_filler_safe"] = float(caught[silent].mean())
                drops_silent.append(row["recall_alone_filler_safe"] - row[f"recall_{position}_filler_safe"])
        row["worst_drop_points"] = 100.0 * max(drops)
        row["worst_drop_points_filler_safe"] = 100.0 * max(drops_silent) if drops_silent else None
        gold_long = score(scorer, [Example(utterance=SEPARATOR.join(p)) for p in gold_parts], "long: gold texts")
        part_flags = is_offensive(score(scorer, [Example(utterance=x) for x in flat_gold], "long: gold parts"), t)
        any_part = [bool(part_flags[s : s + len(p)].any()) for s, p in zip(starts, gold_parts, strict=True)]
        row["quiet_long_flagged"] = float(is_offensive(quiet_long, t).mean())
        row["gold_long_flagged"] = float(is_offensive(gold_long, t).mean())
        row["gold_parts_flagged"] = float(part_flags.mean())
        row["gold_any_part_flagged"] = float(np.mean(any_part))
        out["scorers"][role] = row
    return out


def collages(
    offensive: Sequence[LabelledExample],
    quiet: Sequence[str],
    harmless: Sequence[str],
    seed: int = 0,
    total_chars: int = TOTAL_CHARS,
) -> tuple[list[list[str]], list[list[str]], dict[str, list[str]]]:
    """The long texts, one of each kind per offensive utterance (seeded): the quiet filler parts,
    the gold filler parts, and each utterance embedded in its quiet filler at each position."""
    rng = np.random.default_rng(seed)
    room = [total_chars - len(ex.utterance) - len(SEPARATOR) for ex in offensive]
    quiet_parts = [filler(quiet, r, rng) for r in room]
    gold_parts = [filler(harmless, r, rng) for r in room]
    texts = {
        position: [embed(ex.utterance, p, position, rng) for ex, p in zip(offensive, quiet_parts, strict=True)]
        for position in POSITIONS
    }
    return quiet_parts, gold_parts, texts


# --- tried: other decision rules for a message read in several windows (not in force) ----------------
WindowRule = Callable[[np.ndarray, float], bool]


def _shifted(shift: float) -> WindowRule:
    """The worst window against ``sigmoid(logit(t) + shift * ln n)``: a bar that rises with the windows."""

    def rule(w: np.ndarray, t: float) -> bool:
        return bool(w.max() >= 1.0 / (1.0 + np.exp(-(np.log(t / (1.0 - t)) + shift * np.log(len(w))))))

    return rule


def _multi(threshold: float) -> WindowRule:
    """The worst window against ``threshold`` when there are several windows (``t`` for one)."""
    return lambda w, t: bool(w.max() >= (t if len(w) == 1 else threshold))


def _top2_mean(w: np.ndarray, t: float) -> bool:
    return bool(np.sort(w)[-2:].mean() >= t)


def _second(w: np.ndarray, t: float) -> bool:
    return bool(np.sort(w)[-2 if len(w) > 1 else -1] >= t)


WINDOW_RULES: dict[str, WindowRule] = {
    "max (in force)": lambda w, t: bool(w.max() >= t),
    **{f"max, t + {b:.2f}·ln n (logit)": _shifted(b) for b in (0.04, 0.08, 0.14, 0.2, 0.3, 0.5)},
    **{f"max, {x:.2f} if n > 1": _multi(x) for x in (0.46, 0.5, 0.55, 0.6, 0.7)},
    "mean of the top 2 windows": _top2_mean,
    "second-highest window": _second,
}


def window_scores(classifier: Any, texts: Sequence[str]) -> list[np.ndarray]:
    """The main score of each window of each text (no history), each window scored as a row of its
    own; their maximum is the text's score (:func:`dialogue_safety.core.scoring.decomposed_logits`).
    ``classifier``: an ``OnnxClassifier`` (``encode`` and ``predict_encoded``)."""
    encoded = classifier.encode([Example(utterance=x) for x in texts])
    rows = [replace(w, more=()) for e in encoded for w in e.rows]
    scores = np.array([p.score for p in classifier.predict_encoded(rows)], dtype=float)
    bounds = np.cumsum([0] + [len(e.rows) for e in encoded])
    return [scores[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def compare_window_rules(
    classifier: Any,
    get: SplitGetter,
    split: Split = Split.VALID,
    seed: int = 0,
    per_source: int = PER_SOURCE,
    total_chars: int = TOTAL_CHARS,
    rules: Mapping[str, WindowRule] = WINDOW_RULES,
) -> dict[str, Any]:
    """Each rule of ``rules`` on the suite's collages built from ``split``: the quiet texts flagged,
    the recall of the embedded utterances per position, the worst drop below alone, the recall over
    a fixed set (the utterances whose quiet text the rule in force does not flag: what the rule
    costs of the utterance's own catches), and the F1 of embedded texts against quiet ones."""
    probes = build_probes(get, seed, per_source, split=split)
    offensive: list[LabelledExample] = probes["offensive"]
    harmless: list[str] = probes["harmless"]
    t = float(classifier.card.threshold)
    alone_harmless = np.array([p.score for p in classifier.predict([Example(utterance=x) for x in harmless])])
    quiet = [x for x, q in zip(harmless, is_offensive(alone_harmless, t), strict=True) if not q]
    quiet_parts, _, texts = collages(offensive, quiet, harmless, seed, total_chars)
    alone = is_offensive(np.array([p.score for p in classifier.predict([ex.as_example() for ex in offensive])]), t)
    quiet_w = window_scores(classifier, [SEPARATOR.join(p) for p in quiet_parts])
    embedded_w = {position: window_scores(classifier, texts[position]) for position in POSITIONS}
    fixed = np.array([w.max() < t for w in quiet_w])
    out: dict[str, Any] = {
        "split": str(split),
        "threshold": t,
        "n_offensive": len(offensive),
        "recall_alone": float(alone.mean()),
        "harmless_flagged_alone": float(np.mean(is_offensive(alone_harmless, t))),
        "windows": _stats([len(w) for w in quiet_w]),
        "quiet_windows_flagged": float(np.mean(np.concatenate(quiet_w) >= t)),
        "n_fixed": int(fixed.sum()),
        "recall_alone_fixed": float(alone[fixed].mean()) if fixed.any() else None,
        "rules": {},
    }
    for name, rule in rules.items():
        quiet_flags = np.array([rule(w, t) for w in quiet_w])
        caught = {p: np.array([rule(w, t) for w in embedded_w[p]]) for p in POSITIONS}
        recall = {p: float(c.mean()) for p, c in caught.items()}
        tp = float(sum(c.sum() for c in caught.values()))
        fp = float(quiet_flags.sum()) * len(POSITIONS)  # one quiet text per embedded text
        fn = len(POSITIONS) * len(offensive) - tp
        out["rules"][name] = {
            "quiet_flagged": float(quiet_flags.mean()),
            "recall": recall,
            "worst_drop_points": 100.0 * (out["recall_alone"] - min(recall.values())),
            "worst_recall_fixed": min(float(c[fixed].mean()) for c in caught.values()) if fixed.any() else None,
            "f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0,
        }
    return out


def window_rules_markdown(result: Mapping[str, Any]) -> str:
    lines = [
        f"{result['n_offensive']} offensive {result['split']} utterances (recall alone {result['recall_alone']:.1%}); "
        f"windows per text {result['windows'].get('median', 0):.0f} (median); {result['quiet_windows_flagged']:.1%} "
        f"of quiet windows and {result['harmless_flagged_alone']:.1%} of harmless utterances alone flagged at "
        f"{result['threshold']:.3f}; fixed subset: {result['n_fixed']} utterances whose quiet text the rule in force "
        f"does not flag (recall alone {result['recall_alone_fixed'] or 0:.1%}).",
        "",
        "| rule | quiet texts flagged | start | middle | end | random | worst drop (pts) | worst, fixed subset | F1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["rules"].items():
        cells = " | ".join(f"{r['recall'][p]:.1%}" for p in POSITIONS)
        fixed = r["worst_recall_fixed"]
        lines.append(
            f"| {name} | {r['quiet_flagged']:.1%} | {cells} | {r['worst_drop_points']:.1f} | "
            f"{'—' if fixed is None else f'{fixed:.1%}'} | {r['f1']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dialogue_safety.evaluation.long_messages MODEL_DIR``: the decision rules tried for
    messages read in several windows, on the suite's collages built from the validation splits."""
    import argparse
    from pathlib import Path

    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.sources.registry import load_source

    parser = argparse.ArgumentParser(
        prog="python -m dialogue_safety.evaluation.long_messages", description=main.__doc__
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--split", default=Split.VALID.value, choices=[s.value for s in Split])
    parser.add_argument("--limit", type=int, default=PER_SOURCE, help="offensive utterances per source")
    parser.add_argument("--chars", type=int, default=TOTAL_CHARS, help="characters of a long text in all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", default=None, help="ONNX variant (default: the card's)")
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads")
    args = parser.parse_args(argv)
    classifier = OnnxClassifier(args.model_dir, variant=args.variant, intra_op_threads=args.threads)
    loaded: dict[str, list[LabelledExample]] = {}

    def get(name: str, split: Split) -> list[LabelledExample]:
        rows = loaded.setdefault(name, list(load_source(name, args.data_dir)))
        return [ex for ex in rows if ex.split == split]

    result = compare_window_rules(classifier, get, Split(args.split), args.seed, args.limit, args.chars)
    print(window_rules_markdown(result))
    return 0


def _stats(values: Sequence[int]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values)
    return {"min": float(arr.min()), "median": float(np.median(arr)), "max": float(arr.max())}


def markdown(result: Mapping[str, Any]) -> str:
    """The report section: one row per scorer."""
    sources = ", ".join(result.get("sources", []))
    lines = [
        f"{result.get('n_offensive', 0)} offensive test utterances ({sources}) alone and embedded in harmless test "
        f"text, {result.get('chars', {}).get('median', 0):.0f} characters in all (median), at the start, middle, end "
        "and a random place. The filler of these *quiet* texts is made of the "
        f"{result.get('quiet_utterances', 0)} of {result.get('harmless_utterances', 0)} harmless test utterances that "
        "the model scores SAFE alone; *gold* texts are made of any harmless test utterance "
        f"({result.get('parts_per_text', {}).get('median', 0):.0f} per text, median).",
        "",
        "| scorer | recall alone | start | middle | end | random | worst drop (pts) | quiet texts flagged | "
        "gold texts flagged | gold parts flagged alone | gold texts with a part flagged alone |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = result.get("scorers", {})
    for role, r in rows.items():
        lines.append(
            f"| {role} | {r['recall_alone']:.1%} | {r['recall_start']:.1%} | {r['recall_middle']:.1%} | "
            f"{r['recall_end']:.1%} | {r['recall_random']:.1%} | {r['worst_drop_points']:.1f} | "
            f"{r['quiet_long_flagged']:.1%} | {r['gold_long_flagged']:.1%} | {r['gold_parts_flagged']:.1%} | "
            f"{r['gold_any_part_flagged']:.1%} |"
        )
    lines += [
        "",
        "The same, only over the utterances whose quiet filler text is not flagged on its own (a catch there is the "
        "utterance's, not a false alarm of the filler):",
        "",
        "| scorer | utterances | recall alone | start | middle | end | random | worst drop (pts) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for role, r in rows.items():
        if r.get("recall_alone_filler_safe") is None:
            continue
        lines.append(
            f"| {role} | {r['n_filler_safe']} | {r['recall_alone_filler_safe']:.1%} | "
            + " | ".join(f"{r[f'recall_{p}_filler_safe']:.1%}" for p in POSITIONS)
            + f" | {r['worst_drop_points_filler_safe']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
