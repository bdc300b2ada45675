"""``dialogue-safety evaluate MODEL``: the robustness report of a model.

MODEL is an exported model directory (``model.onnx`` → ONNX runtime), a training checkpoint
(``config.json`` + ``model.safetensors`` → torch) or the word ``tfidf-baseline`` (the baseline
itself as the model: a cheap way to see the whole report). Writes ``report.md``,
``results.json`` (every number) and PNG plots to ``--out``.

Suites: ``rounds`` (held-out and adversarial rounds), ``functional`` (HateCheck-style suites),
``aaa`` (Adversarial Attacks against Abuse), ``context`` (with vs without history),
``context_flips`` (the same reply after a harmful and a harmless turn), ``history`` (benign-history
recall, hostile-history flag rate, counter-speech: dialogue_safety/evaluation/history_robustness.py),
``long_messages`` (an offensive utterance inside 4,000 characters of harmless text:
dialogue_safety/evaluation/long_messages.py), ``obfuscation`` (offensive and harmless test utterances
with disguised words: dialogue_safety/evaluation/obfuscation.py) and
``baseline`` (adds a TF-IDF + LR row/column to every table). See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dialogue_safety.core.schema import LabelledExample, Split
from dialogue_safety.evaluation.context_flips import SUITE_FILE, evaluate_context_flips, load_pairs
from dialogue_safety.evaluation.sampling import subsample  # noqa: F401 - also imported from here
from dialogue_safety.evaluation.scorers import (
    CachedScorer,
    Scorer,
    card_training_curve,
    card_training_sources,
    load_scorer,
    model_kind,
)

if TYPE_CHECKING:
    from dialogue_safety.evaluation.baseline import TfidfBaseline
# The suites (scikit-learn, SciPy) are imported where they run, so that a bad argument fails in
# well under a second instead of after the imports.

log = logging.getLogger("dialogue_safety.evaluation.evaluate")

SUITES: tuple[str, ...] = (
    "rounds",
    "functional",
    "aaa",
    "context",
    "context_flips",
    "history",
    "long_messages",
    "obfuscation",
    "baseline",
    "peer",
)
#: sources evaluated by the rounds and context suites (missing ones are skipped with a note)
EVAL_SOURCES: tuple[str, ...] = (
    "olid",
    "diasafety",
    "convabuse",
    "hatemoji",
    "dynahate",
    "conan",  # hate (OFFENSIVE) and civil counter-narratives after it (SAFE)
    "bbf_single_turn",
    "bbf_multi_turn",
    "bad",
    "wtc",
    "bad_fsb",  # BAD's validation split re-split by dialogue: its test part (human and bot turns)
    "toxicchat",
    "safetext",
    "medical_safety",
    "requests",
    "conda",
    "context_toxicity",
    "edos",
    "ghc",
)
FUNCTIONAL_SUITES: tuple[str, ...] = ("hatecheck",)
EVAL_SPLITS: tuple[Split, ...] = (Split.VALID, Split.TEST)
BASELINE_MODEL = "tfidf-baseline"
#: where reports go unless --out says otherwise: runs/ is ignored by git (reports/default is committed)
DEFAULT_OUT_ROOT = Path("runs") / "evaluate"

SourceLoader = Callable[[str, Path], list[LabelledExample]]


def registry_loader(name: str, data_dir: Path) -> list[LabelledExample]:
    """All splits of a source, read by ``dialogue_safety.sources.registry``."""
    from dialogue_safety.sources.registry import load_source

    return list(load_source(name, data_dir))


#: columns that link a HatemojiCheck-style case to its perturbations (see functional.SuiteKeys)
PAIR_COLUMNS: tuple[str, ...] = ("test_group_id", "test_grp_id", "templ_id")


def load_suite_csv(name: str, path: str | Path) -> list[LabelledExample]:
    """A functional suite CSV read with the column mapping preset called ``name``.

    Presets are the ``ColumnMapping`` constants of ``dialogue_safety.sources.functional`` (``hatecheck``,
    ``hatemojicheck``). The pairing ids (``test_group_id``/``templ_id``) are added to each
    case's metadata from the same file, keyed by ``case_id``, when the mapping leaves them out.
    """
    import csv
    import dataclasses

    from dialogue_safety.sources import functional as suites

    presets = {m.suite: m for m in vars(suites).values() if isinstance(m, suites.ColumnMapping)}
    if name not in presets:
        raise ValueError(f"no column mapping called {name!r} for {path}; presets: {', '.join(sorted(presets))}")
    mapping = presets[name]
    csv_path = Path(path)
    if not csv_path.is_file():
        raise FileNotFoundError(f"functional suite file {csv_path} does not exist")
    cases = list(suites.read_suite(csv_path, mapping))
    if mapping.case_id is None:
        return cases
    with csv_path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        extra = [c for c in PAIR_COLUMNS if c in (reader.fieldnames or [])]
        ids = {row[mapping.case_id].strip(): {c: row[c].strip() for c in extra} for row in reader} if extra else {}
    if not ids:
        return cases
    return [
        dataclasses.replace(c, metadata={**ids.get(str(c.metadata.get("case_id")), {}), **c.metadata}) for c in cases
    ]


@dataclass(frozen=True)
class EvaluationConfig:
    suites: tuple[str, ...] = SUITES
    sources: tuple[str, ...] = EVAL_SOURCES
    functional: tuple[str, ...] = FUNCTIONAL_SUITES
    functional_csv: tuple[tuple[str, str], ...] = ()  # (column-mapping preset, CSV path)
    aaa_sources: tuple[str, ...] | None = None  # None: every evaluated source with train and test
    baseline_sources: tuple[str, ...] | None = None  # None: the model card's, else the default four
    context_flips_csv: str = str(SUITE_FILE)
    seed: int = 0
    limit: int | None = None
    batch_size: int = 256
    progress: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.suites) - set(SUITES)
        if unknown:
            raise ValueError(f"unknown suites {sorted(unknown)}; choose from {', '.join(SUITES)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be positive, got {self.limit}")


class DataCache:
    """Loads each source once; remembers why a source could not be loaded."""

    def __init__(self, data_dir: Path, loader: SourceLoader) -> None:
        self.data_dir = data_dir
        self.loader = loader
        self._loaded: dict[str, list[LabelledExample]] = {}
        self.skipped: dict[str, str] = {}

    def get(self, name: str) -> list[LabelledExample] | None:
        if name in self._loaded:
            return self._loaded[name]
        if name in self.skipped:
            return None
        from dialogue_safety.sources.registry import load_present_sources  # the one missing/malformed policy

        present = load_present_sources([name], self.data_dir, loader=self.loader)
        if name in present.skipped:
            self.skipped[name] = present.skipped[name]
            return None
        self._loaded[name] = present.examples[name]
        return self._loaded[name]

    def split(self, name: str, split: Split) -> list[LabelledExample]:
        return [e for e in self.get(name) or [] if e.split == split]


def fit_baseline(data: DataCache, sources: Iterable[str]) -> tuple[TfidfBaseline, dict[str, Any]]:
    """TF-IDF + LR on the train splits of ``sources``, threshold tuned on their valid splits."""
    from dialogue_safety.evaluation.baseline import TfidfBaseline

    train: list[LabelledExample] = []
    valid: list[LabelledExample] = []
    used = []
    for name in sources:
        tr, va = data.split(name, Split.TRAIN), data.split(name, Split.VALID)
        if tr or va:
            used.append(name)
        train += tr
        valid += va
    if not train:
        raise FileNotFoundError(f"the baseline has no training data: no train split in {list(sources)}")
    baseline = TfidfBaseline.fit(train, valid)
    return baseline, {**baseline.info, "name": baseline.name, "sources": used}


def jsonable(value: Any) -> Any:
    """Plain JSON: numpy scalars to Python, NaN/inf to None."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run_evaluation(
    scorer: Scorer | None,
    data_dir: str | Path,
    out_dir: str | Path | None,
    config: EvaluationConfig = EvaluationConfig(),
    *,
    loader: SourceLoader | None = None,
    training_sources: Sequence[str] | None = None,
    baseline: Scorer | None = None,
    model_info: Mapping[str, Any] | None = None,
    previous: Scorer | None = None,
    previous_info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the configured suites; write report.md, results.json and plots to ``out_dir`` (if given).

    ``loader`` reads a source's examples (default: ``dialogue_safety.sources.registry``).
    ``scorer=None`` evaluates the TF-IDF baseline itself as the model. ``training_sources`` (the
    model card's) decides the baseline's training data unless ``config.baseline_sources`` is
    set; ``baseline`` passes a ready-made baseline scorer instead of fitting one. ``previous`` adds a
    second model as the ``previous`` column of every table (``--compare``: the model it replaces).
    """
    from dialogue_safety.evaluation.baseline import DEFAULT_TRAINING_SOURCES
    from dialogue_safety.evaluation.context_ablation import evaluate_context
    from dialogue_safety.evaluation.functional_suites import evaluate_functional
    from dialogue_safety.evaluation.rounds import evaluate_rounds

    data_dir = Path(data_dir)
    data = DataCache(data_dir, loader or registry_loader)
    results: dict[str, Any] = {
        "model": {},
        "config": {k: v for k, v in asdict(config).items() if k != "progress"},
        "data_dir": str(data_dir),
        "timings_s": {},
        "skipped": {},
    }
    wants_baseline = "baseline" in config.suites or scorer is None
    if wants_baseline and baseline is None:
        start = time.perf_counter()
        names = config.baseline_sources or tuple(training_sources or DEFAULT_TRAINING_SOURCES)
        baseline, info = fit_baseline(data, names)
        results["baseline"] = info
        results["timings_s"]["baseline_fit"] = time.perf_counter() - start
    elif wants_baseline and baseline is not None:
        results["baseline"] = {
            "name": baseline.name,
            "threshold": float(baseline.threshold),
            **getattr(baseline, "info", {}),
        }
    if scorer is None:
        assert baseline is not None
        scorer = baseline
    results["model"] = {"name": scorer.name, "threshold": float(scorer.threshold), **(model_info or {})}
    model = CachedScorer(scorer, config.batch_size, config.progress)
    scorers: dict[str, Scorer] = {"model": model}
    if previous is not None:
        results["previous"] = {"name": previous.name, "threshold": float(previous.threshold), **(previous_info or {})}
        scorers["previous"] = CachedScorer(previous, config.batch_size, config.progress)
    if "baseline" in config.suites and baseline is not None and baseline is not scorer:
        scorers["baseline"] = CachedScorer(baseline, config.batch_size, config.progress)
    if "peer" in config.suites:
        from dialogue_safety.evaluation.peer import ProfanityCheckScorer

        try:
            peer = ProfanityCheckScorer()
        except ImportError as exc:
            results["skipped"]["peer"] = str(exc)
            log.warning("no peer row: %s", exc)
        else:
            scorers["peer"] = CachedScorer(peer, config.batch_size, config.progress)
            results["peer"] = {"name": peer.name, "threshold": peer.threshold}
    results["roles"] = list(scorers)

    eval_examples: list[LabelledExample] = []
    if {"rounds", "context"} & set(config.suites):
        for name in config.sources:
            for split in EVAL_SPLITS:
                eval_examples += subsample(data.split(name, split), config.limit, config.seed)

    def timed(suite: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        log.info("running %s", suite)
        value = fn()
        results["timings_s"][suite] = time.perf_counter() - start
        return value

    if "rounds" in config.suites:
        results["rounds"] = timed("rounds", lambda: evaluate_rounds(eval_examples, scorers)) if eval_examples else None
    if "functional" in config.suites:
        suites: dict[str, Any] = {}
        found: list[tuple[str, list[LabelledExample]]] = []
        for name in config.functional:
            if cases := data.get(name):
                found.append((name, cases))
        for name, path in config.functional_csv:
            found.append((name, load_suite_csv(name, path)))
        for name, cases in found:
            cases = subsample(cases, config.limit, config.seed)
            suites[name] = timed(f"functional/{name}", functools.partial(evaluate_functional, name, cases, scorers))
        results["functional"] = suites
    if "aaa" in config.suites:
        results["aaa"] = timed("aaa", lambda: _run_aaa(data, config, scorers))
    if "context" in config.suites:
        results["context"] = timed("context", lambda: evaluate_context(eval_examples, scorers))
    if "context_flips" in config.suites:
        pairs = load_pairs(config.context_flips_csv)
        results["context_flips"] = timed("context_flips", lambda: evaluate_context_flips(pairs, scorers))
    if "history" in config.suites:
        from dialogue_safety.evaluation.history_robustness import build_probes, evaluate_history

        probes = build_probes(data.split, config.seed)
        results["history"] = timed("history", lambda: evaluate_history(probes, scorers, config.seed))
    if "long_messages" in config.suites:
        from dialogue_safety.evaluation import long_messages

        long_probes = long_messages.build_probes(data.split, config.seed, config.limit or long_messages.PER_SOURCE)
        results["long_messages"] = timed(
            "long_messages", lambda: long_messages.evaluate_long_messages(long_probes, scorers)
        )
    if "obfuscation" in config.suites:
        from dialogue_safety.evaluation import obfuscation

        # its own sources among those asked for, or all of those asked for when none of its own is
        chosen = [s for s in config.sources if s in obfuscation.SOURCES] or list(config.sources)
        per_source = config.limit or obfuscation.PER_SOURCE
        obfuscated = obfuscation.build_probes(data.split, config.seed, per_source, chosen)
        results["obfuscation"] = timed("obfuscation", lambda: obfuscation.evaluate_obfuscation(obfuscated, scorers))
    results["skipped"] = {**results["skipped"], **data.skipped}
    results = jsonable(results)
    if out_dir is not None:
        write_outputs(results, Path(out_dir))
    return results


def _run_aaa(data: DataCache, config: EvaluationConfig, scorers: Mapping[str, Scorer]) -> dict[str, Any]:
    from dialogue_safety.evaluation.aaa import AAAResources, evaluate_aaa

    try:
        resources = AAAResources.load(data.data_dir)
    except (FileNotFoundError, ValueError) as exc:
        return {"sources": {}, "error": str(exc)}
    out: dict[str, Any] = {"sources": {}, "not_run": {}}
    for name in config.aaa_sources or config.sources:
        if data.get(name) is None:
            continue
        train, test = data.split(name, Split.TRAIN), data.split(name, Split.TEST)
        if not train or not test:
            out["not_run"][name] = "needs a train and a test split"
            continue
        test = subsample(test, config.limit, config.seed)
        out["sources"][name] = evaluate_aaa(name, train, test, resources, scorers, config.seed)
    return out


def write_outputs(results: Mapping[str, Any], out_dir: Path) -> None:
    """results.json, the PNG plots and report.md."""
    from dialogue_safety.evaluation.plots import write_plots
    from dialogue_safety.evaluation.report import render_report

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    plots = write_plots(results, out_dir)
    (out_dir / "report.md").write_text(render_report(results, plots), encoding="utf-8")


def _csv(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _preset_path(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--functional-csv expects PRESET=PATH, got {value!r}")
    return name.strip(), path.strip()


def argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the paths on the command line (checked before any work), or None."""
    import importlib.util

    from dialogue_safety.extras import install_hint

    for value in args.functional_csv:
        try:
            _, path = _preset_path(value)
        except ValueError as exc:
            return str(exc)
        if not Path(path).is_file():
            return f"--functional-csv: no file at {path}"
    out = Path(args.out) if args.out else None
    if out is not None and (out.exists() and not out.is_dir() or any(p.is_file() for p in out.parents)):
        return f"--out {out}: a file is in the way of the report's directory"  # found now, not after the run
    if args.model == BASELINE_MODEL:
        return None
    model = Path(args.model)
    try:
        kind = model_kind(model)
    except (FileNotFoundError, ValueError) as exc:
        return f"{exc} (pass an exported model directory such as models/default, a checkpoint or {BASELINE_MODEL!r})"
    if kind == "checkpoint" and importlib.util.find_spec("torch") is None:
        return f"{model} is a training checkpoint: evaluating it needs torch ({install_hint('train')})"
    return None


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model",
        help=f"exported model directory, training checkpoint, or {BASELINE_MODEL!r} (the baseline as the model)",
    )
    parser.add_argument(
        "--data-dir", default=None, help="datasets (default: $DIALOGUE_SAFETY_DATA_DIR or ../shared/data)"
    )
    parser.add_argument(
        "--suite", default=",".join(SUITES), help=f"comma-separated suites (default: {','.join(SUITES)})"
    )
    parser.add_argument("--out", default=None, help=f"output directory (default: {DEFAULT_OUT_ROOT}/<model name>)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the AAA attacks and of --limit's subsampling")
    parser.add_argument("--limit", type=int, default=None, help="at most N examples per source split / suite")
    parser.add_argument("--sources", default=None, help=f"evaluated sources (default: {','.join(EVAL_SOURCES)})")
    parser.add_argument(
        "--functional", default=None, help=f"functional suites (default: {','.join(FUNCTIONAL_SUITES)})"
    )
    parser.add_argument(
        "--functional-csv",
        action="append",
        default=[],
        metavar="PRESET=PATH",
        help="an extra functional suite CSV read with a column-mapping preset, e.g. hatemojicheck=HatemojiCheck.csv",
    )
    parser.add_argument(
        "--aaa-sources", default=None, help="AAA sources (default: every evaluated source with train+test)"
    )
    parser.add_argument(
        "--baseline-sources", default=None, help="baseline training sources (default: the model card's)"
    )
    parser.add_argument(
        "--compare",
        default=None,
        metavar="MODEL",
        help="a second model (directory or checkpoint) evaluated beside MODEL as the 'previous' column",
    )
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from dialogue_safety.sources.data_dir import resolve_data_dir

    problem = argument_problem(args)
    if problem:
        print(f"{prog or 'evaluate'}: error: {problem}", file=sys.stderr)
        return 2
    try:
        data_dir = resolve_data_dir(args.data_dir)
        config = EvaluationConfig(
            suites=_csv(args.suite) or SUITES,
            sources=_csv(args.sources) or EVAL_SOURCES,
            functional=_csv(args.functional) or FUNCTIONAL_SUITES,
            functional_csv=tuple(_preset_path(v) for v in args.functional_csv),
            aaa_sources=_csv(args.aaa_sources),
            baseline_sources=_csv(args.baseline_sources),
            seed=args.seed,
            limit=args.limit,
            batch_size=args.batch_size,
            progress=not args.no_progress,
        )
        scorer: Scorer | None
        if args.model == BASELINE_MODEL:
            scorer, training_sources, name = None, None, BASELINE_MODEL
            info: dict[str, Any] = {"path": BASELINE_MODEL, "kind": "baseline"}
        else:
            scorer = load_scorer(args.model)
            training_sources = card_training_sources(args.model)
            info = {"path": str(args.model), "kind": model_kind(args.model), "training_sources": training_sources}
            curve = card_training_curve(args.model)
            if curve is not None:
                info["training_curve"] = curve
            name = Path(args.model).resolve().name
        out = Path(args.out) if args.out else DEFAULT_OUT_ROOT / name
        previous, previous_info = None, None
        if args.compare:
            previous = load_scorer(args.compare)
            previous_info = {"path": str(args.compare), "kind": model_kind(args.compare)}
        results = run_evaluation(
            scorer,
            data_dir,
            out,
            config,
            training_sources=training_sources,
            model_info=info,
            previous=previous,
            previous_info=previous_info,
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"{prog or 'evaluate'}: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out / 'report.md'}, {out / 'results.json'} and plots")
    timings = ", ".join(f"{k} {v:.1f}s" for k, v in results["timings_s"].items())
    print(f"timings: {timings}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
