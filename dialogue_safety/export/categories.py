"""Per-category decision thresholds, tuned on the validation splits through the runtime.

Each head of a model (a ``categories`` entry of an answer) gets its own threshold: the one that
maximises its macro OFFENSIVE-F1 over the validation splits of the sources that label it (a label
family's head: the sources of that family, against their labels; an attribute head, ``violence`` or
``unsafe_request``: the rows that carry the attribute, ``metadata[head]``, against it). A label
family's head reads only the sources whose gold the card's recipe trusts for a threshold
(``training.recipe.threshold_tasks``: :func:`threshold_sources`; e.g. 0.5.0's leaves out the Reddit
reply sets, which label only part of what a score means). The test splits are never read here.

**The rule for a head too weak to decide**: a head *decides* (``categories[c]`` can be true, and
``/v1/moderations`` flags on it) only when its macro OFFENSIVE-F1 at its own threshold, over those
validation splits, is at least :data:`MIN_DECIDING_F1`; below that it is reported as a score only
(never true). A head without validation rows that label it has no entry, and is a score only too.

The result lives in the card (:attr:`dialogue_safety.core.model_card.ModelCard.categories`), written
by ``dialogue-safety export`` (from the training sources' validation splits) and, for a model
directory already exported, by::

    python -m dialogue_safety.export.categories models/default --data-dir ../shared/data --max-per-split 300

which scores with the fp32 variant (the same numbers on every CPU) and rewrites ``model_card.json``
and ``MODEL_CARD.md``. ``--max-per-split N`` scores a seeded sample of N examples of each larger split
(recorded in each entry as ``max_per_split``): the bundled model's card was written so, on a shared
2-core machine; ``export`` scores every example.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.training.harmonise import ATTRIBUTE_HEADS

log = logging.getLogger("dialogue_safety.export.categories")

#: a head whose macro OFFENSIVE-F1 (percent) at its own validation-tuned threshold is below this is a score only
MIN_DECIDING_F1 = 50.0
#: the decimals the card keeps of each validation figure
_DECIMALS = {"offensive_f1": 2, "precision": 2, "recall": 2, "pr_auc": 4}


def labelled_rows(head: str, examples: Sequence[LabelledExample]) -> tuple[list[int], np.ndarray]:
    """The rows of a split that label ``head`` and their gold (1: the head's positive): an attribute head's
    rows carrying the attribute; for a label family's head, every row of a split of that family (its most
    common family, as training judges a head on its family's tasks), against the split's labels."""
    if head in ATTRIBUTE_HEADS:
        rows = [i for i, e in enumerate(examples) if head in e.metadata]
        return rows, np.array([int(bool(examples[i].metadata[head])) for i in rows], dtype=int)
    family = Counter(e.family.value for e in examples).most_common(1)[0][0] if examples else None
    if family != head:
        return [], np.zeros(0, dtype=int)
    return list(range(len(examples))), np.array([int(e.label.is_positive) for e in examples], dtype=int)


def threshold_sources(card: Any) -> frozenset[str] | None:
    """The sources whose validation splits tune a threshold: those of the tasks the card's recipe tunes its
    own threshold on (``threshold_tasks``; a task ``bad_fsb/bot`` is of the source ``bad_fsb``), or None
    (every source) when the card records none."""
    recipe = (getattr(card, "training", None) or {}).get("recipe") or {}
    tasks = recipe.get("threshold_tasks") if isinstance(recipe, Mapping) else None
    return frozenset(str(t).split("/")[0] for t in tasks) if tasks else None


def tune_categories(
    heads: Sequence[str],
    probabilities: Mapping[str, np.ndarray],
    validation: Mapping[str, Sequence[LabelledExample]],
    sources: frozenset[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per head: ``threshold``, ``score_only``, ``valid_macro_f1`` and the per-split ``valid`` figures.

    ``probabilities``: per validation split, [n, heads] calibrated probabilities of its examples (in
    ``heads`` order); ``validation``: the labelled examples of each split; ``sources``: only the splits of
    these sources count for a label family's head (:func:`threshold_sources`; None: every split)."""
    from dialogue_safety.training.calibration import choose_threshold
    from dialogue_safety.training.metrics import binary_metrics

    out: dict[str, dict[str, Any]] = {}
    for h, head in enumerate(heads):
        per_split: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, examples in validation.items():
            if sources is not None and head not in ATTRIBUTE_HEADS and name.split("/")[0] not in sources:
                continue  # an attribute head's gold is the attribute, not the served label: every split counts
            rows, gold = labelled_rows(head, examples)
            if rows and gold.any():
                per_split[name] = (gold, np.asarray(probabilities[name])[rows, h])
        if not per_split:
            continue
        threshold, f1 = choose_threshold(per_split, "macro")
        macro = float(np.mean(list(f1.values())))
        figures = {
            name: {k: v for k, v in binary_metrics(gold, scores, threshold).items() if k in ("n", "positives")}
            | {
                k: (None if v is None else round(float(v), _DECIMALS[k]))
                for k, v in binary_metrics(gold, scores, threshold).items()
                if k in _DECIMALS
            }
            for name, (gold, scores) in sorted(per_split.items())
        }
        out[head] = {
            "threshold": threshold,
            "score_only": macro < MIN_DECIDING_F1,
            "valid_macro_f1": round(macro, 2),
            "valid": figures,
        }
    return out


def validation_sets(
    sources: Sequence[str], data_dir: Path | None, max_per_split: int | None = None, seed: int = 0
) -> dict[str, list[LabelledExample]]:
    """The validation splits of ``sources`` that are present (missing ones are skipped); with ``max_per_split``,
    a larger split is a seeded random sample of that many examples (the same on every run)."""
    from dialogue_safety.sources.registry import load_present_sources

    present = load_present_sources(sources, data_dir, splits=["valid"])
    out = {}
    for name, examples in present.examples.items():
        if max_per_split is not None and len(examples) > max_per_split:
            examples = random.Random(f"{seed}:{name}").sample(examples, max_per_split)
        if examples:
            out[name] = list(examples)
    return out


def categories_for(
    model_dir: Path, validation: Mapping[str, Sequence[LabelledExample]], cache: Path | None = None
) -> dict[str, dict[str, Any]]:
    """:func:`tune_categories` for the model in ``model_dir``, scored by its fp32 variant through the runtime
    (``cache``: an ``.npz`` of the probabilities per split, read if it holds every split, else written)."""
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.scoring import head_probabilities

    clf = OnnxClassifier(model_dir, variant="fp32")
    if cache is not None and cache.is_file():
        with np.load(cache) as saved:
            stored = {name.replace("|", "/"): saved[name] for name in saved.files}
        if set(stored) == set(validation) and all(len(stored[n]) == len(v) for n, v in validation.items()):
            return tune_categories(clf.card.heads, stored, validation, threshold_sources(clf.card))
    probabilities = {}
    for name, examples in validation.items():
        started = time.perf_counter()
        probabilities[name] = head_probabilities(clf.logits([e.as_example() for e in examples]), clf.card)
        log.info("scored %s (%d examples) in %.0f s", name, len(examples), time.perf_counter() - started)
        if cache is not None:  # after each split: an interrupted run keeps what it scored
            arrays: dict[str, Any] = {n.replace("/", "|"): p for n, p in probabilities.items()}
            save: Any = np.savez  # numpy's stub reads **arrays as its allow_pickle flag
            save(cache, **arrays)
    return tune_categories(clf.card.heads, probabilities, validation, threshold_sources(clf.card))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dialogue_safety.export.categories",
        description="Tune each category's threshold on the validation splits of the model's training sources "
        "(fp32, through the runtime) and write them into the model directory's card.",
    )
    p.add_argument("model_dir", type=Path)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument(
        "--max-per-split",
        type=int,
        default=None,
        help="score at most this many examples of each validation split (a seeded sample; default: all)",
    )
    p.add_argument("--cache", type=Path, default=None, help="keep the scored probabilities here (.npz) to tune again")
    p.add_argument("--dry-run", action="store_true", help="print the result, write nothing")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from dialogue_safety.core.model_card import CARD_MARKDOWN_FILE, ModelCard
    from dialogue_safety.export.card_markdown import render_model_card

    card = ModelCard.load(args.model_dir)
    sources = [str(s) for s in card.training.get("sources") or []]
    started = time.perf_counter()
    validation = validation_sets(sources, args.data_dir, args.max_per_split)
    log.info("read %d validation splits in %.0f s", len(validation), time.perf_counter() - started)
    if not validation:
        print(f"{p.prog}: no validation split of {sources} found", file=sys.stderr)
        return 2
    card.categories = categories_for(args.model_dir, validation, args.cache)
    if args.max_per_split is not None:
        for entry in card.categories.values():
            entry["max_per_split"] = args.max_per_split
    for head, entry in card.categories.items():
        print(
            f"{head:<18} threshold {entry['threshold']:.3f}  valid macro F1 {entry['valid_macro_f1']:5.1f}  "
            f"{'score only' if entry['score_only'] else 'decides'}  ({', '.join(entry['valid'])})"
        )
    if not args.dry_run:
        card.save(args.model_dir)
        (args.model_dir / CARD_MARKDOWN_FILE).write_text(render_model_card(card), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
