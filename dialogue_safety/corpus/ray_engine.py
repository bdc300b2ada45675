"""The Ray Data engine: the same job as :func:`dialogue_safety.corpus.job.run_local`, spread over a Ray cluster.

    read (Ray Data reader) → map_batches(RowScorer, a pool of actors) → ordered results → write

* **Model shipping**: the driver packs the model directory's files that the job needs (card,
  tokenizer, the ONNX artifact and the variant it runs, derived on the driver if missing) into
  one object in Ray's object store; each actor unpacks it into its own temporary directory and
  builds one :class:`dialogue_safety.core.runtime.OnnxClassifier` from there. Workers never read the model
  from their own disk by path, so a cluster needs no shared filesystem or pre-installed model.
* **Threads**: each actor reserves ``threads_per_actor`` CPUs and runs onnxruntime with that
  many intra-op threads; the pool has ``actors`` of them (default: the cluster's CPUs divided
  by the threads per actor, so the CPUs are used without oversubscription).
* **Rows**: each actor parses and validates its rows with the same code as the local engine
  (:func:`dialogue_safety.corpus.records.parse_row`, :func:`dialogue_safety.corpus.records.score_rows`), so a row
  that cannot be scored comes back as an error record and scores equal the local engine's and the API's.
  JSONL is read as text lines and parsed in the actors (a bad line is an error record).
* **Write**: results stream back to the driver in input order (``preserve_order``) and are
  written with the local engine's writer into one output file, so both engines produce the same
  file. The input path must be readable by every worker (a shared filesystem) when the cluster
  has more than one node.

Not resumable (a failed Ray job is run again); the local engine is.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dialogue_safety.core.limits import Limits
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import Policy
from dialogue_safety.corpus.formats import CorpusFileError, format_of, merge_parts, parse_jsonl_line, write_part
from dialogue_safety.corpus.job import ScoreJob, Summary, load_classifier
from dialogue_safety.corpus.records import (
    Columns,
    Row,
    count_errors,
    flatten,
    parse_row,
    score_rows,
    unflatten,
)

LINE_COLUMN = "text"  # ray.data.read_text's column
RESULTS_PER_PART = 8192


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # None: start a local Ray for the job ("auto": the running cluster)
    num_cpus: int | None = None  # CPUs of a local Ray started for the job (default: all)
    actors: int | None = None
    threads_per_actor: int = 1
    batch_size: int | None = None  # rows per map_batches call (default: the job's chunk size)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise CorpusFileError(f"--engine ray needs Ray Data ({exc}): pip install 'dialogue-safety[scale]'") from exc
    return ray


def pack_model(model_dir: Path, variant: str | None) -> bytes:
    """The files an actor needs to run ``variant`` of the model in ``model_dir``, as one tar."""
    from dialogue_safety.core import variants
    from dialogue_safety.core.model_card import CARD_FILE, TOKENIZER_FILE, ModelCard

    card = ModelCard.load(model_dir)
    name = variant or card.cpu_variant
    path = variants.ensure_variant(model_dir, name, card)  # derive once here, not on every worker
    files = {CARD_FILE: model_dir / CARD_FILE, TOKENIZER_FILE: model_dir / TOKENIZER_FILE}
    files[variants.ARTIFACT_FILE] = model_dir / variants.ARTIFACT_FILE
    files[variants.variant_file(name, card, model_dir / variants.ARTIFACT_FILE)] = path
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for arcname, src in files.items():
            tar.add(str(src), arcname=arcname)
    return buffer.getvalue()


def unpack_model(blob: bytes) -> Path:
    directory = Path(tempfile.mkdtemp(prefix="dialogue-safety-model-"))
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(directory, filter="data")
    return directory


class RowScorer:
    """A Ray Data actor: one OnnxClassifier, many batches of rows."""

    def __init__(
        self,
        model_ref: list[Any],
        columns: Columns,
        limits: Limits,
        threads: int,
        job: ScoreJob,
        jsonl: bool,
        runtime: dict[str, Any] | None = None,
        policy: Policy | None = None,
    ) -> None:
        import ray

        self.model_dir = unpack_model(ray.get(model_ref[0]))
        # the runtime as the command built it from the settings (as serve does), one actor's threads
        self.classifier = load_classifier(
            replace(job, model_dir=self.model_dir), intra_op_threads=threads, limits=limits, runtime=runtime
        )
        threshold, explain, explain_history = job.threshold, job.explain, job.explain_history
        explain_method = job.explain_method
        self.columns, self.limits, self.jsonl = columns, limits, jsonl
        self.threshold, self.explain, self.explain_history = threshold, explain, explain_history
        self.explain_method = explain_method
        self.policy = policy
        self.fields = columns.output_fields(explain, policy=policy is not None)

    def _rows(self, batch: Any) -> list[Row]:
        records = batch.to_pylist()
        if not self.jsonl:
            return [parse_row(r, self.columns, self.limits) for r in records]
        return [parse_jsonl_line(r[LINE_COLUMN], "JSONL line", self.columns, self.limits) for r in records]

    def __call__(self, batch: Any) -> dict[str, list[Any]]:
        records = score_rows(
            self.classifier,
            self._rows(batch),
            self.columns,
            threshold=self.threshold,
            explain=self.explain,
            explain_history=self.explain_history,
            explain_method=self.explain_method,
            limits=self.limits,
            policy=self.policy,
        )
        flat = [flatten(r) for r in records]  # Arrow needs one type per column: nested values as JSON
        return {k: [r[k] for r in flat] for k in self.fields}

    def __del__(self) -> None:
        shutil.rmtree(getattr(self, "model_dir", ""), ignore_errors=True)


# Reading is light next to inference: read tasks reserve no CPU, so that actors holding every CPU
# of a small cluster (2 actors on 2 CPUs) do not starve the reads that feed them.
def _no_cpu(reader: Any) -> dict[str, Any]:
    """``num_cpus=0`` for a Ray Data reader (a named parameter in recent Ray, ``ray_remote_args`` before)."""
    import inspect

    if "num_cpus" in inspect.signature(reader).parameters:
        return {"num_cpus": 0}
    return {"ray_remote_args": {"num_cpus": 0}}


def _read(ray: Any, path: Path, fmt: str) -> Any:
    source = str(path.resolve())  # a local path, the same on every node (a shared filesystem)
    if fmt == "jsonl":
        return ray.data.read_text(source, drop_empty_lines=True, **_no_cpu(ray.data.read_text))
    if fmt == "csv":
        import csv

        import pyarrow as pa
        import pyarrow.csv as pacsv

        with open(path, newline="", encoding="utf-8-sig") as f:  # the header without a BOM, as pyarrow reads it
            header = next(csv.reader(f), [])
        # every cell a string, as the local engine reads CSV (an id 007 stays "007", an empty cell "")
        convert = pacsv.ConvertOptions(column_types={name: pa.string() for name in header}, strings_can_be_null=False)
        return ray.data.read_csv(
            source,
            convert_options=convert,
            parse_options=pacsv.ParseOptions(newlines_in_values=True),
            **_no_cpu(ray.data.read_csv),
        )
    return ray.data.read_parquet(source, **_no_cpu(ray.data.read_parquet))


def run_ray(
    job: ScoreJob,
    options: RayOptions,
    *,
    limits: Limits | None = None,
    progress: bool = True,
    runtime: dict[str, Any] | None = None,
) -> Summary:
    """Score ``job`` on Ray Data (a local Ray started for the job unless ``options.address``); ``limits``
    as in :func:`dialogue_safety.corpus.job.run_local`; ``runtime``: the actors' runtime options
    (:func:`dialogue_safety.core.runtime_options.runtime_options`; each actor runs ``threads_per_actor``
    intra-op threads whatever they say)."""
    from dialogue_safety.core.model_dir import default_model_dir

    ray = _ray()
    started = time.perf_counter()
    fmt = format_of(job.input)
    model_dir = Path(job.model_dir or default_model_dir())
    blob = pack_model(model_dir, job.variant)
    own_ray = not ray.is_initialized()
    if own_ray:
        init: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if options.address:
            init["address"] = options.address
        elif options.num_cpus:
            init["num_cpus"] = options.num_cpus
        ray.init(**init)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = progress
        threads = max(1, options.threads_per_actor)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        actors = options.actors or max(1, cpus // threads)
        model_ref = ray.put(blob)
        ds = _read(ray, job.input, fmt)
        scored = ds.map_batches(
            RowScorer,
            fn_constructor_kwargs={
                "model_ref": [model_ref],
                "columns": job.columns,
                "limits": limits or Limits(),
                "threads": threads,
                "job": job,
                "policy": job.rules(ModelCard.load(model_dir).heads),
                "jsonl": fmt == "jsonl",
                "runtime": runtime,
            },
            batch_size=options.batch_size or job.chunk_size,
            batch_format="pyarrow",
            num_cpus=threads,
            compute=ray.data.ActorPoolStrategy(size=actors),
        )
        summary = _write_ordered(scored, job)
    finally:
        if own_ray:
            ray.shutdown()
    summary.engine = f"ray ({actors} actors x {threads} threads)"
    summary.seconds = time.perf_counter() - started
    return summary


def _write_ordered(scored: Any, job: ScoreJob) -> Summary:
    """Stream the results (in input order) into ``job.output`` through parts of the local writer."""
    parts_dir = Path(tempfile.mkdtemp(prefix=job.output.name + ".ray-", dir=job.output.parent))
    summary = Summary(output=str(job.output))
    parts: list[Path] = []
    pending: list[dict[str, Any]] = []

    def flush() -> None:
        path = parts_dir / f"part-{len(parts):06d}{job.output.suffix}"
        write_part(pending, path, job.fields)
        parts.append(path)
        summary.errors += count_errors(pending)
        summary.rows += len(pending)
        pending.clear()

    try:
        for batch in scored.iter_batches(batch_size=None, batch_format="pyarrow"):
            pending.extend(unflatten({k: r.get(k) for k in job.fields}) for r in batch.to_pylist())
            if len(pending) >= RESULTS_PER_PART:
                flush()
        if pending:
            flush()
        merge_parts(parts, job.output, job.fields)
    finally:
        shutil.rmtree(parts_dir, ignore_errors=True)
    summary.scored = summary.rows - summary.errors
    return summary
