"""The local engine: score a corpus file in chunks with one in-process :class:`OnnxClassifier`.

    job = ScoreJob(Path("comments.jsonl"), Path("runs/scored.parquet"))
    summary = run_local(job)

Resumable: every chunk is written as its own part file in ``<output>.parts/`` (atomically,
named by chunk index) next to a manifest describing the job. A run that finds that directory
with a matching manifest skips the rows of the parts already written and carries on, so after
an interruption no row is scored twice and none is skipped. When every chunk is written the
parts are streamed into ``output`` and the directory is removed. A manifest that does not
match (another input, model, chunk size, columns...) is refused unless ``restart`` is set.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dialogue_safety.core.explain import METHODS, Method
from dialogue_safety.core.limits import Limits
from dialogue_safety.core.policy import Policy, load_policy
from dialogue_safety.corpus.formats import (
    CorpusFileError,
    ReadCounts,
    count_rows,
    iter_chunks,
    merge_parts,
    require_readable_format,
    write_part,
)
from dialogue_safety.corpus.records import Columns, count_errors, score_rows

MANIFEST = "manifest.json"
PARTS_SUFFIX = ".parts"
STATS_SUFFIX = ".stats.json"  # a part's row and error counts, beside it; written last, so it marks the part complete
DEFAULT_CHUNK_SIZE = 2048


@dataclass(frozen=True)
class ScoreJob:
    """Everything that decides a job's output (the manifest records it)."""

    input: Path
    output: Path
    model_dir: Path | None = None  # None: the bundled model (dialogue_safety.core.model_dir.default_model_dir)
    columns: Columns = field(default_factory=Columns)
    threshold: float | None = None
    variant: str | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    explain: bool = False
    explain_history: bool = False
    explain_method: Method = "shapley"
    policy: Path | None = None  # an operator policy file (dialogue_safety.core.policy)

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.explain_method not in METHODS:
            raise ValueError(f"explain_method must be one of {METHODS}, got {self.explain_method!r}")
        require_readable_format(self.input)  # refused before anything is written (no empty .parts/ left)
        require_readable_format(self.output)
        if not Path(self.input).is_file():
            raise CorpusFileError(f"{self.input}: no such file")
        if Path(self.input).resolve() == Path(self.output).resolve():
            raise CorpusFileError(f"{self.output}: the output must not be the input")
        self.rules()  # a bad policy file is refused before anything is written (PolicyError: file, line, problem)

    def rules(self, heads: Sequence[str] | None = None) -> Policy | None:
        """The job's operator policy, read and checked (``heads``: the model's, when known)."""
        return None if self.policy is None else load_policy(self.policy, heads)

    @property
    def parts_dir(self) -> Path:
        return self.output.with_name(self.output.name + PARTS_SUFFIX)

    @property
    def fields(self) -> list[str]:
        return self.columns.output_fields(self.explain, policy=self.policy is not None)

    def manifest(self, model_id: str, limits: Limits) -> dict[str, Any]:
        """What makes two runs the same job (a resumed run must match it): the input, the model, and every setting
        that changes a row's output, the request limits and the policy file's contents included."""
        stat = Path(self.input).stat()
        manifest = {
            "input": str(Path(self.input).resolve()),
            "input_bytes": stat.st_size,
            "input_mtime_ns": stat.st_mtime_ns,
            "model": model_id,
            "columns": asdict(self.columns),
            "threshold": self.threshold,
            "variant": self.variant,
            "chunk_size": self.chunk_size,
            "explain": self.explain,
            "explain_history": self.explain_history,
            "explain_method": self.explain_method,
            "policy": None if self.policy is None else str(self.policy),
            "policy_sha256": None if self.policy is None else _file_sha256(Path(self.policy)),
            "limits": asdict(limits),
        }
        return dict(json.loads(json.dumps(manifest)))  # as it reads back from the file (tuples → lists)


@dataclass
class Summary:
    rows: int = 0
    scored: int = 0
    errors: int = 0
    resumed_rows: int = 0
    blank_lines: int = 0  # blank or whitespace-only lines passed over, not rows (local engine)
    seconds: float = 0.0
    output: str = ""
    engine: str = "local"

    @property
    def rows_per_s(self) -> float:
        done = self.rows - self.resumed_rows
        return done / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows_per_s": round(self.rows_per_s, 2)}


def load_classifier(
    job: ScoreJob,
    intra_op_threads: int | None = None,
    limits: Limits | None = None,
    runtime: dict[str, Any] | None = None,
) -> Any:
    """The job's classifier: built from ``runtime`` (:func:`dialogue_safety.core.runtime_options.runtime_options`,
    what the command read from the settings; default: the runtime's defaults), for the job's variant and
    threshold, reading at most the windows a row may need."""
    from dialogue_safety.core.model_dir import default_model_dir
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.runtime_options import runtime_options

    options = {
        **(runtime or {}),
        **runtime_options(
            variant=job.variant,
            # windows over a long utterance: at most the limit a row must keep (a row that needs more is an error)
            max_windows=(limits or Limits()).max_windows,
            # the int8 check covers the threshold the job decides at
            thresholds=None if job.threshold is None else (job.threshold,),
            intra_op_threads=intra_op_threads or None,
        ),
    }
    return OnnxClassifier(job.model_dir or default_model_dir(), **options)


def _part(parts_dir: Path, index: int, suffix: str) -> Path:
    return parts_dir / f"part-{index:06d}{suffix}"


def _stats(parts_dir: Path, index: int) -> Path:
    return parts_dir / f"part-{index:06d}{STATS_SUFFIX}"


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _completed_parts(job: ScoreJob, model_id: str, limits: Limits, restart: bool) -> int:
    """Parts already written by an interrupted run of this same job (0 for a fresh start)."""
    parts_dir = job.parts_dir
    manifest = job.manifest(model_id, limits)
    if parts_dir.exists():
        try:
            found = json.loads((parts_dir / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            found = None
        if found != manifest and not restart:
            changed = sorted(k for k in manifest if not isinstance(found, dict) or found.get(k) != manifest[k])
            raise CorpusFileError(
                f"{parts_dir}: an interrupted job with other settings ({', '.join(changed) or 'no manifest'}) "
                "is there; run the same command again to resume it, or pass --restart to start over"
            )
        if found != manifest or restart:
            shutil.rmtree(parts_dir)
    if not parts_dir.exists():
        parts_dir.mkdir(parents=True)
        (parts_dir / MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        return 0
    return _parts_on_disk(parts_dir, job.output.suffix)


def _parts_on_disk(parts_dir: Path, suffix: str) -> int:
    """How many parts are complete (a part is complete once its stats file is: both are renamed into place)."""
    done = 0
    while _part(parts_dir, done, suffix).is_file() and _stats(parts_dir, done).is_file():
        done += 1
    return done


def _write_stats(parts_dir: Path, index: int, rows: int, errors: int) -> None:
    """A part's stats, written last and atomically: an interrupt never leaves a half-written one behind."""
    path = _stats(parts_dir, index)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"rows": rows, "errors": errors}), encoding="utf-8")
    os.replace(tmp, path)


def run_local(
    job: ScoreJob,
    *,
    classifier: Any = None,
    limits: Limits | None = None,
    restart: bool = False,
    progress: bool = True,
    total: int | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> Summary:
    """Score ``job.input`` into ``job.output`` chunk by chunk (resuming an interrupted run). ``limits``:
    the per-item limits a row must keep (default: the API's defaults; ``dialogue-safety score`` passes
    the ``SAFETY_MAX_*`` settings)."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    limits = limits or Limits()
    classifier = classifier if classifier is not None else load_classifier(job, limits=limits)
    policy = job.rules(classifier.card.heads) if job.policy is not None else None
    created = not job.parts_dir.exists()
    done_parts = _completed_parts(job, classifier.model_id, limits, restart)
    parts_dir, suffix = job.parts_dir, job.output.suffix
    summary = Summary(output=str(job.output))
    for i in range(done_parts):
        stats: Mapping[str, int] = json.loads(_stats(parts_dir, i).read_text(encoding="utf-8"))
        summary.rows += stats["rows"]
        summary.errors += stats["errors"]
    summary.resumed_rows = summary.rows
    if total is None and progress:
        total = count_rows(job.input, limits.max_body_bytes)
    bar = tqdm(total=total, initial=summary.rows, unit="rows", disable=not progress, dynamic_ncols=True, smoothing=0.1)
    index = done_parts
    counts = ReadCounts()
    try:
        for chunk in iter_chunks(job.input, job.columns, limits, job.chunk_size, skip=summary.rows, counts=counts):
            records = score_rows(
                classifier,
                chunk,
                job.columns,
                threshold=job.threshold,
                explain=job.explain,
                explain_history=job.explain_history,
                explain_method=job.explain_method,
                limits=limits,
                policy=policy,
            )
            errors = count_errors(records)
            write_part(records, _part(parts_dir, index, suffix), job.fields)
            _write_stats(parts_dir, index, len(records), errors)
            summary.rows += len(records)
            summary.errors += errors
            bar.update(len(records))
            bar.set_postfix(errors=summary.errors, refresh=False)
            index += 1
            if on_chunk is not None:
                on_chunk(index)
    except BaseException:
        # refused before its first part: nothing to resume, nothing left behind. Asked of the disk, not of
        # ``index``: an interrupt between a part's stats and ``index += 1`` must keep that part
        if created and _parts_on_disk(parts_dir, suffix) == 0:
            shutil.rmtree(parts_dir, ignore_errors=True)
        raise
    finally:
        bar.close()
    merge_parts([_part(parts_dir, i, suffix) for i in range(index)], job.output, job.fields)
    shutil.rmtree(parts_dir)
    summary.blank_lines = counts.blank_lines  # the whole file's: every run reads it from its first line
    summary.scored = summary.rows - summary.errors
    summary.seconds = time.perf_counter() - started
    return summary
