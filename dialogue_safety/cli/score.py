"""``dialogue-safety score INPUT OUTPUT``: score a corpus file, locally or on Ray Data.

    dialogue-safety score comments.jsonl runs/scored.csv
    dialogue-safety score chats.parquet runs/scored.parquet --id-field msg_id --history-field context
    dialogue-safety score comments.csv runs/scored.jsonl --engine ray --address auto
    dialogue-safety score transcripts.jsonl runs/scored.jsonl --policy docs/policy.example.toml
    dialogue-safety score transcripts.jsonl runs/turns.jsonl --every-turn --roles assistant

A row with a ``messages`` field (OpenAI chat messages) is judged on its last message, the others
its history, as ``/v1/classify`` reads ``messages``. With ``--every-turn`` its record also has
``turns``: a verdict for every message (of ``--roles``), each given the messages before it, as
``/v1/classify/conversation`` answers. With an operator policy (``--policy``, else
``SAFETY_POLICY``) the output has a ``policy`` column: the rule that decided or changed the label.

Formats come from the extensions (.jsonl/.ndjson, .csv, .parquet). Prints a JSON summary
(rows, scored, errors, seconds, rows/s) on stdout; the progress bar goes to stderr. Every default
comes from the same settings as ``dialogue-safety serve`` (:class:`ServiceSettings`, the ``SAFETY_*``
environment): the model directory, variant and threshold (flags win), and the per-item limits a row
must keep (``SAFETY_MAX_*``). The command joins the corpus engines (:mod:`dialogue_safety.corpus`)
and the service's settings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.explain import DEFAULT_METHOD, METHODS
from dialogue_safety.core.messages import judged_roles
from dialogue_safety.core.runtime import ModelLoadError
from dialogue_safety.core.runtime_options import runtime_options
from dialogue_safety.core.schema import check_threshold
from dialogue_safety.corpus.formats import CorpusFileError
from dialogue_safety.corpus.job import DEFAULT_CHUNK_SIZE, ScoreJob, run_local
from dialogue_safety.corpus.records import Columns
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import load_onnx_classifier


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", type=Path, help="JSONL, CSV or Parquet file to score")
    p.add_argument("output", type=Path, help="where to write the scores (format from the extension)")
    p.add_argument(
        "--model", type=Path, default=None, help="model directory (default: $SAFETY_MODEL_DIR, else the bundled model)"
    )
    p.add_argument(
        "--variant",
        default=None,
        help="ONNX variant (fp32, optimized, int8, fp16; default: $SAFETY_VARIANT, else the card's)",
    )
    p.add_argument(
        "--threshold", type=float, default=None, help="decision threshold (default: $SAFETY_THRESHOLD, else the card's)"
    )
    cols = p.add_argument_group("columns")
    cols.add_argument("--text-field", default=None, help="the utterance field (default: 'utterance', else 'text')")
    cols.add_argument("--history-field", default="history", help="history field: a list or a JSON string ('' = none)")
    cols.add_argument("--id-field", default="id", help="id field carried into the output ('' = none)")
    cols.add_argument("--carry", default="", help="comma-separated extra input fields copied to the output")
    cols.add_argument(
        "--messages-field",
        default="messages",
        help="chat transcripts: a row with this field (OpenAI chat messages) is judged on its last message ('' = none)",
    )
    cols.add_argument("--include-system", action="store_true", help="transcripts: keep system messages in the history")
    cols.add_argument(
        "--every-turn",
        action="store_true",
        help="transcripts: also judge every message (of --roles) given the ones before it, in a 'turns' column",
    )
    cols.add_argument(
        "--roles",
        default="",
        help="with --every-turn: the roles judged, comma-separated (default: user,assistant)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="operator policy file (TOML; docs/policy.example.toml; default: $SAFETY_POLICY, else none)",
    )
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="rows per chunk (memory bound)")
    p.add_argument("--explain", action="store_true", help="add per-word contributions to the score (Shapley values)")
    p.add_argument("--explain-history", action="store_true", help="with --explain: explain history words too")
    p.add_argument(
        "--explain-method",
        choices=METHODS,
        default=DEFAULT_METHOD,
        help="with --explain: shapley (sees redundant words; default) or occlusion (leave one word out)",
    )
    p.add_argument("--restart", action="store_true", help="discard an interrupted run's parts instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    ray = p.add_argument_group("engine")
    ray.add_argument("--engine", choices=("local", "ray"), default="local", help="local process or Ray Data")
    ray.add_argument("--address", default=None, help="Ray cluster address ('auto', ray://host:10001); default: local")
    ray.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray started for the job")
    ray.add_argument("--actors", type=int, default=None, help="Ray: scoring actors (default: CPUs / threads)")
    ray.add_argument("--threads-per-actor", type=int, default=1, help="Ray: onnxruntime threads (= CPUs) per actor")
    ray.add_argument("--batch-size", type=int, default=None, help="Ray: rows per map_batches call (default: chunk)")
    return p


def columns_from_args(args: argparse.Namespace) -> Columns:
    return Columns(
        utterance=args.text_field or None,
        history=args.history_field or None,
        id=args.id_field or None,
        carry=tuple(c.strip() for c in args.carry.split(",") if c.strip()),
        messages=args.messages_field or None,
        include_system=args.include_system,
        every_turn=args.every_turn,
        roles=tuple(r.strip() for r in args.roles.split(",") if r.strip()) or None,
    )


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety score") -> int:
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.explain_history and not args.explain:
        print(f"{prog}: --explain-history needs --explain", file=sys.stderr)
        return 2
    if args.roles and not args.every_turn:
        print(f"{prog}: --roles needs --every-turn", file=sys.stderr)
        return 2
    try:
        judged_roles(columns_from_args(args).roles, "--roles")
        if args.threshold is not None:
            check_threshold(args.threshold, "--threshold")  # as SAFETY_THRESHOLD and a request's are checked
    except InvalidInput as exc:
        print(f"{prog}: {exc.message}", file=sys.stderr)
        return 2
    try:
        settings = ServiceSettings()  # the serve command's settings: the same defaults for files
        limits = settings.limits
        job = ScoreJob(
            input=args.input,
            output=args.output,
            model_dir=args.model or settings.model_dir,
            columns=columns_from_args(args),
            threshold=args.threshold if args.threshold is not None else settings.threshold,
            variant=args.variant or settings.variant,
            chunk_size=args.chunk_size,
            explain=args.explain,
            explain_history=args.explain_history,
            explain_method=args.explain_method,
            policy=args.policy or settings.policy,
        )
        if args.engine == "ray":
            from dialogue_safety.corpus.ray_engine import RayOptions, run_ray
            from dialogue_safety.corpus.stderr_filter import RAY_HARMLESS, dropping

            options = RayOptions(
                address=args.address,
                num_cpus=args.num_cpus,
                actors=args.actors,
                threads_per_actor=args.threads_per_actor,
                batch_size=args.batch_size,
            )
            # the actors' runtime as serve builds it (providers, spinning, batch budget...), one actor's threads each
            runtime = runtime_options(settings)
            with dropping(RAY_HARMLESS):  # Ray's alarming but harmless lines (an "E ... core_worker" line...)
                summary = run_ray(job, options, limits=limits, progress=not args.no_progress, runtime=runtime)
        else:
            # the runtime as serve builds it (providers, threads, batch budget...), for this job's model,
            # variant and threshold
            job_settings = {"model_dir": job.model_dir, "variant": job.variant, "threshold": job.threshold}
            classifier = load_onnx_classifier(settings.model_copy(update=job_settings))
            summary = run_local(
                job, classifier=classifier, limits=limits, restart=args.restart, progress=not args.no_progress
            )
    except (CorpusFileError, ModelLoadError, ValueError, OSError) as exc:  # OSError: an output it cannot write
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    print(json.dumps(summary.as_dict()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
