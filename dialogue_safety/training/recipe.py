"""Training recipes: small TOML files loaded into a frozen dataclass, with ``key=value`` overrides.

A recipe names the base encoder, the tasks of the multi-task mixture with their sampling
weights (the BBF "mixing parameter"; ``round_weights`` upsample later adversarial rounds,
Dynabench-style), the head layout, the optimisation settings and the encoding settings.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dialogue_safety.core.batch_budget import MAX_BATCH_TOKENS
from dialogue_safety.core.encoding import EncodingConfig

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"  # <checkout>/dialogue_safety/training/
HEAD_MODES = ("shared", "per_family", "hierarchical", "harmonised")
THRESHOLD_OBJECTIVES = ("macro", "pooled", "selection")  # dialogue_safety.training.calibration.choose_threshold


@dataclass(frozen=True)
class TaskSpec:
    """One task of the mixture: a source (optionally restricted to a sub-task and rounds).

    ``weight`` multiplies how often the task's examples are drawn per epoch (2.0 = each
    example twice on average; 0.5 = half of them). ``required`` tasks fail the run when their
    data is missing or sample-only; optional ones are skipped with a warning.
    """

    source: str
    weight: float = 1.0
    task: str | None = None
    rounds: tuple[str, ...] | None = None
    round_weights: dict[str, float] = field(default_factory=dict)
    required: bool = True

    def __post_init__(self) -> None:
        _check_types(self)

    @property
    def name(self) -> str:
        return self.task or self.source


@dataclass(frozen=True)
class Recipe:
    name: str
    base: str = "minilm"
    vocab_file: str | None = None
    tasks: tuple[TaskSpec, ...] = ()
    eval_sources: tuple[str, ...] = ()  # extra evaluation-only sources (never trained on), e.g. hatecheck
    heads: str = "shared"
    epochs: float = 2.0
    max_steps: int | None = None
    batch_size: int = 32
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    max_grad_norm: float = 1.0
    dropout: float = 0.1
    freeze_word_embeddings: bool = False  # 11.7M of MiniLM's 22.7M parameters: much faster on CPU
    seed: int = 0
    bucket_size: int = 50  # batches per length-sorted bucket
    threshold_objective: str = "macro"
    # the tasks whose validation sets the threshold (and the keep-best check) is tuned on; empty = every task
    # with a validation split (sources whose served gold is partial or noisy can be left out)
    threshold_tasks: tuple[str, ...] = ()
    calibrate: bool = True
    eval_every: int = 0  # steps between validation checks (logged as "valid" events); 0 = none
    keep_best: bool = False  # restore the weights of the best validation check (``selection_score``) at the end
    # keep-best's score subtracts this many F1 points per point (%) the model flags of the SAFE-only validation sets
    # (their mean): the macro F1 alone cannot see false alarms on sets without positives (0 = F1 alone)
    false_alarm_penalty: float = 0.0
    # the general-moderation guard: the validation recall (%) of the served score that these tasks (general, non-chat
    # text: olid, dynahate, ghc, edos, threats) must keep at the selection threshold, task name -> floor. Each point
    # of recall below a floor costs ``general_recall_penalty`` F1 points in keep-best's score and, under the
    # ``selection`` threshold objective, in the threshold's (dialogue_safety.training.calibration.RecallFloors).
    # The tasks need not be threshold_tasks; evaluation-only suites (hatecheck) are never tasks. Empty = no guard
    general_recall_floors: dict[str, float] = field(default_factory=dict)
    general_recall_penalty: float = 0.0
    # > 0: the weights are averaged over the run (exponentially, this decay per step, a plain running mean over the
    # first 1/(1 - decay) steps); validation checks, keep-best and the saved model use the average, which steadies
    # judgements that swing between neighbouring steps of the raw weights. 0 = the last step's weights
    average_decay: float = 0.0
    checkpoint_every: int = 200
    log_every: int = 10
    max_examples_per_task: int | None = None
    eval_batch_tokens: int = (
        MAX_BATCH_TOKENS  # the serving budget (dialogue_safety.core.batch_budget); raise it on a GPU
    )
    num_threads: int | None = None
    init_from: str | None = None  # a training checkpoint (same base and heads) to start from: continued training
    version: str = "0.1.0"
    model_name: str = "dialogue-safety"
    encoding: EncodingConfig = field(default_factory=EncodingConfig)
    intended_use: str = ""
    limitations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_types(self)
        if self.batch_size < 1 or self.epochs <= 0 or self.learning_rate <= 0:
            raise ValueError(
                f"batch_size must be >= 1, epochs and learning_rate > 0; got {self.batch_size}, {self.epochs}, "
                f"{self.learning_rate}"
            )
        if self.heads not in HEAD_MODES:
            raise ValueError(f"heads must be one of {HEAD_MODES}, got {self.heads!r}")
        if self.threshold_objective not in THRESHOLD_OBJECTIVES:
            raise ValueError(f"threshold_objective must be one of {THRESHOLD_OBJECTIVES}")
        if not self.tasks:
            raise ValueError(f"recipe {self.name!r} has no tasks")
        unknown = set(self.threshold_tasks) - {t.name for t in self.tasks}
        if unknown:
            raise ValueError(f"threshold_tasks {sorted(unknown)} are not tasks of recipe {self.name!r}")
        if self.false_alarm_penalty < 0:
            raise ValueError(f"false_alarm_penalty must be >= 0, got {self.false_alarm_penalty}")
        unguarded = set(self.general_recall_floors) - {t.name for t in self.tasks}
        if unguarded:
            raise ValueError(f"general_recall_floors {sorted(unguarded)} are not tasks of recipe {self.name!r}")
        bad = {k: v for k, v in self.general_recall_floors.items() if not 0.0 <= float(v) <= 100.0}
        if bad:
            raise ValueError(f"general_recall_floors are recall in percent (0-100), got {bad}")
        if self.general_recall_penalty < 0 or (self.general_recall_floors and not self.general_recall_penalty):
            raise ValueError(
                f"general_recall_penalty must be > 0 with general_recall_floors (F1 points per point of recall "
                f"below a floor), got {self.general_recall_penalty}"
            )
        if not 0.0 <= self.average_decay < 1.0:
            raise ValueError(f"average_decay must be in [0, 1), got {self.average_decay}")
        if self.keep_best and self.eval_every <= 0:
            raise ValueError("keep_best needs eval_every > 0 (steps between validation checks)")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))


#: the scalar annotations a recipe's values are checked against (a TOML or --set value of another type fails here,
#: naming the key, not hours later inside training)
_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
}


def _check_types(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        kind = str(f.type).replace(" | None", "")
        expected = _SCALARS.get(kind)
        value = getattr(obj, f.name)
        if expected is None or (value is None and str(f.type).endswith("| None")):
            continue
        if not isinstance(value, expected) or (bool not in expected and isinstance(value, bool)):
            what = {"float": "a number", "int": "an integer", "str": "a string", "bool": "true or false"}[kind]
            raise ValueError(f"{f.name} must be {what}, got {value!r}")


def add_override_argument(parser: Any, help: str = "override a recipe value, e.g. --set epochs=3") -> None:
    """The ``--set KEY=VALUE`` option of every command that loads a recipe (values go to ``apply_overrides``)."""
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=f"{help} (repeatable)"
    )


def _coerce(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides; dotted keys reach into tables (``encoding.max_length=64``,
    ``tasks.diasafety.weight=2``). Values are parsed as JSON when they can be."""
    out = json.loads(json.dumps(raw))
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not key=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if parts[0] == "tasks" and len(parts) not in (1, 3):
            raise ValueError(f"override {item!r}: a task's value is tasks.<task>.<key>=VALUE (tasks.olid.weight=2)")
        if parts[0] == "tasks" and len(parts) == 3:
            matches = [t for t in out.get("tasks", []) if (t.get("task") or t["source"]) == parts[1]]
            if not matches:
                raise ValueError(f"override {item!r}: no task named {parts[1]!r}")
            for t in matches:
                t[parts[2]] = _coerce(value)
            continue
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = _coerce(value)
    return out


def recipe_from_dict(raw: dict[str, Any]) -> Recipe:
    raw = dict(raw)
    known = {f.name for f in dataclasses.fields(Recipe)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown recipe keys: {sorted(unknown)} (known: {sorted(known)})")
    tasks = []
    task_keys = {f.name for f in dataclasses.fields(TaskSpec)}
    for t in raw.pop("tasks", []):
        t = dict(t)
        if set(t) - task_keys:
            raise ValueError(f"unknown task keys: {sorted(set(t) - task_keys)} (known: {sorted(task_keys)})")
        if "rounds" in t and t["rounds"] is not None:
            t["rounds"] = tuple(str(r) for r in t["rounds"])
        tasks.append(TaskSpec(**t))
    encoding = EncodingConfig.from_dict(raw.pop("encoding", {}))
    for key in ("eval_sources", "limitations", "threshold_tasks"):
        if key in raw:
            raw[key] = tuple(raw[key])
    return Recipe(tasks=tuple(tasks), encoding=encoding, **raw)


def load_recipe(name_or_path: str, overrides: list[str] | None = None) -> Recipe:
    """Load ``recipes/<name>.toml`` or a path to a TOML/JSON file, then apply overrides."""
    path = Path(name_or_path)
    if not path.is_file():
        path = RECIPES_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in RECIPES_DIR.glob("*.toml"))
        raise FileNotFoundError(f"no recipe {name_or_path!r}: not a file, and not one of {available}")
    text = path.read_text(encoding="utf-8")
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot parse recipe: {exc}") from exc
    raw.setdefault("name", path.stem)
    try:
        return recipe_from_dict(apply_overrides(raw, overrides or []))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
