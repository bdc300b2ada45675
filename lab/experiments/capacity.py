"""Does more capacity pay? Frozen-encoder probes, fine-tuned checkpoints and their ensembles, on validation.

A larger encoder is only worth distilling if it knows more than the small one. Fine-tuning
all-mpnet-base-v2 (110M parameters, 12 layers of 768) costs about eight MiniLM-L6 runs, so this
tool measures the cheaper questions first, every row on the same validation sample and scored like
the trainer's periodic check (per-source served OFFENSIVE-F1 at the macro-best threshold):

* **frozen probe**: mean-pooled sentence embeddings of (history, utterance) from an encoder with
  its weights untouched, and a logistic regression on the served head's training targets. Two
  encoders probed the same way say which one's representation knows more about offence.
* **fine-tuned**: a training checkpoint's served score.
* **ensemble**: the mean of a checkpoint's and a probe's probabilities (or of two checkpoints'), at
  weights 0.25 / 0.5 for the second member.

Usage::

    python -m lab.experiments.capacity --data-dir ../shared/data \\
        --encoder minilm --encoder /path/to/all-mpnet-base-v2 \\
        --checkpoint checkpoints/h --out runs/capacity

Embeddings are cached under ``--out`` (one ``.npy`` per encoder and sample), so adding a row is
cheap. Writes ``capacity.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from tqdm.auto import tqdm

from dialogue_safety.core.schema import LabelledExample
from dialogue_safety.training.heads import LabelRules, head_names, label_rules
from dialogue_safety.training.inference import TorchClassifier
from dialogue_safety.training.modeling import MINILM, minilm_dir
from dialogue_safety.training.recipe import add_override_argument, load_recipe
from dialogue_safety.training.tasks import load_task_data
from dialogue_safety.training.validation import score_valid_sets


def _sample(rows: Sequence[LabelledExample], n: int, seed: int) -> list[LabelledExample]:
    if len(rows) <= n:
        return list(rows)
    idx = np.random.default_rng(seed).choice(len(rows), size=n, replace=False)
    return [rows[i] for i in sorted(idx)]


def _pair(ex: LabelledExample) -> tuple[str, str | None]:
    """(first segment, second segment): the history (newest turns last) and the utterance."""
    if not ex.history:
        return ex.utterance, None
    return " ".join(t.text for t in ex.history), ex.utterance


def embed(encoder_dir: Path, examples: Sequence[LabelledExample], max_length: int = 128) -> np.ndarray:
    """[n, hidden] L2-normalised mean-pooled embeddings from a frozen Hugging Face encoder."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(encoder_dir))
    model = AutoModel.from_pretrained(str(encoder_dir)).eval()
    pairs = [_pair(ex) for ex in examples]
    order = np.argsort([len(a) + len(b or "") for a, b in pairs])
    out = np.zeros((len(pairs), model.config.hidden_size), dtype=np.float32)
    batch = 32
    with torch.inference_mode():
        for start in tqdm(range(0, len(order), batch), desc=f"embed {encoder_dir.name}", unit="batch"):
            idx = order[start : start + batch]
            firsts = [pairs[i][0] for i in idx]
            seconds = [pairs[i][1] for i in idx]
            if all(s is None for s in seconds):
                enc = tokenizer(firsts, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
            else:  # a batch mixes single texts and pairs: a missing history is an empty first segment
                firsts = [f if s is not None else "" for f, s in zip(firsts, seconds, strict=True)]
                utts = [s if s is not None else pairs[i][0] for s, i in zip(seconds, idx, strict=True)]
                enc = tokenizer(
                    firsts, utts, truncation="longest_first", max_length=max_length, padding=True, return_tensors="pt"
                )
            hidden = model(**{k: v for k, v in enc.items() if k in ("input_ids", "attention_mask")}).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
            out[idx] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
    return out


def _cached(cache: Path, name: str, encoder_dir: Path, examples: Sequence[LabelledExample]) -> np.ndarray:
    key = hashlib.sha256(("\n".join(repr(_pair(ex)) for ex in examples)).encode()).hexdigest()[:12]
    path = cache / f"{name}-{key}.npy"
    if path.is_file():
        return np.load(path)
    vectors = embed(encoder_dir, examples)
    cache.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def score_rows(
    valid: dict[str, list[LabelledExample]], rules: LabelRules, probs: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Per-source served OFFENSIVE-F1 at the macro-best threshold: the trainer's periodic check."""
    sets = {}
    for source, rows in valid.items():
        gold, keep = rules.served_gold(rows)
        sets[source] = (gold[keep], probs[source][keep])
    check = score_valid_sets(sets)
    return {
        "macro_f1": check["macro_f1"],
        "threshold": check["threshold"],
        "f1": check["offensive_f1"],
        "flagged_rate": check.get("flagged_rate", {}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.experiments.capacity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="default", help="the recipe whose tasks and label rules are used")
    add_override_argument(parser)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--encoder", action="append", default=[], help="'minilm' or a Hugging Face encoder dir")
    parser.add_argument("--checkpoint", action="append", default=[], help="a fine-tuned training checkpoint")
    parser.add_argument("--train-per-source", type=int, default=800)
    parser.add_argument("--valid-per-source", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/capacity"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()

    recipe = load_recipe(args.config, args.overrides)
    tasks, _ = load_task_data(recipe, Path(args.data_dir))
    heads = head_names(recipe, tasks)
    rules = label_rules(recipe, heads, [ex for t in tasks for ex in t.train])
    train = {t.spec.name: _sample(t.train, args.train_per_source, args.seed) for t in tasks if t.train}
    valid = {t.spec.name: _sample(t.valid, args.valid_per_source, args.seed) for t in tasks if t.valid}
    train_rows = [ex for rows in train.values() for ex in rows]
    valid_rows = [ex for rows in valid.values() for ex in rows]
    bounds = np.cumsum([0] + [len(rows) for rows in valid.values()])

    def by_source(p: np.ndarray) -> dict[str, np.ndarray]:
        return {s: p[bounds[i] : bounds[i + 1]] for i, s in enumerate(valid)}

    members: dict[str, np.ndarray] = {}
    for path in args.checkpoint:
        clf = TorchClassifier(path)
        members[f"fine-tuned {Path(path).name}"] = clf.predict_proba(valid_rows)
    for spec in args.encoder:
        encoder_dir = minilm_dir() if spec == MINILM else Path(spec)
        name = f"frozen {spec if spec == MINILM else encoder_dir.name}"
        x_train = _cached(args.out, encoder_dir.name + "-train", encoder_dir, train_rows)
        x_valid = _cached(args.out, encoder_dir.name + "-valid", encoder_dir, valid_rows)
        y, keep = rules.served_gold(train_rows)
        probe = LogisticRegression(C=4.0, max_iter=3000).fit(x_train[keep], y[keep])
        members[name] = probe.predict_proba(x_valid)[:, 1]

    rows: dict[str, Any] = {name: score_rows(valid, rules, by_source(p)) for name, p in members.items()}
    names = list(members)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if not first.startswith("fine-tuned"):
                continue
            for w in (0.25, 0.5):
                mixed = (1 - w) * members[first] + w * members[second]
                rows[f"{first} + {w:g} x {second}"] = score_rows(valid, rules, by_source(mixed))

    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "train_per_source": {s: len(r) for s, r in train.items()},
        "valid_per_source": {s: len(r) for s, r in valid.items()},
        "rows": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (args.out / "capacity.json").write_text(json.dumps(report, indent=2))
    scored = [s for s in valid if any(s in r["f1"] for r in rows.values())]
    safe_only = [s for s in valid if s not in scored]
    print("| model | valid macro | " + " | ".join(scored + [f"{s} flagged %" for s in safe_only]) + " |")
    print("|---|---|" + "---|" * (len(scored) + len(safe_only)))
    for name, r in rows.items():
        cells = [f"{r['f1'][s]:.1f}" for s in scored] + [f"{100 * r['flagged_rate'][s]:.1f}" for s in safe_only]
        print(f"| {name} | {r['macro_f1']:.1f} | " + " | ".join(cells) + " |")
    print(f"written {args.out / 'capacity.json'} in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
