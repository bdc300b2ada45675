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
    get: SplitGetter, seed: int = 0, per_source: int = PER_SOURCE, sources: Sequence[str] = SOURCES
) -> dict[str, Any]:
    """The offensive test utterances (a seeded sample per source) and the harmless test utterances
    of the same sources that long texts are made of."""
    offensive: list[LabelledExample] = []
    harmless: list[str] = []
    for name in sources:
        rows = get(name, Split.TEST)
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
    rng = np.random.default_rng(int(probes.get("seed", 0)))
    room = [total_chars - len(ex.utterance) - len(SEPARATOR) for ex in offensive]
    quiet_parts = [filler(quiet, r, rng) for r in room]
    gold_parts = [filler(harmless, r, rng) for r in room]
    texts = {
        position: [embed(ex.utterance, p, position, rng) for ex, p in zip(offensive, quiet_parts, strict=True)]
        for position in POSITIONS
    }
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
