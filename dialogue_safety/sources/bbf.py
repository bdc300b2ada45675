"""BBF dialogue safety (Dinan et al., EMNLP 2019; ParlAI task ``dialogue_safety``).

``single_turn_safety.json``::

    {"standard" | "adversarial": {"train" | "valid" | "test": {"1" | "2" | "3":
        {"good": [record, ...], "bad": [record, ...]}}}}

``multi_turn_safety.json``::

    {"train" | "valid" | "test": [record, ...]}

A record is ``{"text": str, "labels": ["__ok__" | "__notok__"], "label_candidates": [...],
"episode_done": true}``. ``__notok__`` is OFFENSIVE; in the single-turn file the label must agree
with the ``good``/``bad`` bucket it sits in. In the multi-turn file ``text`` holds the dialogue
turns joined by ``"\\n"``: the **last** line is the utterance, earlier lines are its history.

The folder may be ``bbf-dialogue-safety/`` or ParlAI's ``dialogue_safety/``. When only the
hand-transcribed ``sample_*.jsonl`` files are there (each line ``{"source_file", "json_path",
"record"}``), the source is sample-only: the samples go through the same record parser, for
format tests, and must never be used as a dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_json, read_jsonl
from dialogue_safety.sources.layout import SourceFiles, Status, existing_dirs, find_file
from dialogue_safety.sources.splitting import parse_split, split_names

SINGLE_TURN = "bbf_single_turn"
MULTI_TURN = "bbf_multi_turn"
SINGLE_TURN_FILE = "single_turn_safety.json"
MULTI_TURN_FILE = "multi_turn_safety.json"
DIRS = ("bbf-dialogue-safety", "dialogue_safety", "bbf")
OK_CLASS = "__ok__"
NOT_OK_CLASS = "__notok__"
_KINDS = ("standard", "adversarial")
_BUCKETS = {"good": Label.SAFE, "bad": Label.OFFENSIVE}
_SAMPLE_NOTE = "hand-transcribed format samples, not a dataset"

ErrorAt = Callable[[str], DatasetFormatError]


def parlai_label(value: object) -> Label | None:
    """``__ok__`` -> SAFE, ``__notok__`` -> OFFENSIVE, anything else -> None."""
    return {OK_CLASS: Label.SAFE, NOT_OK_CLASS: Label.OFFENSIVE}.get(value) if isinstance(value, str) else None


def parse_record(record: Any, error: ErrorAt) -> tuple[str, Label]:
    """The ``(text, label)`` of one ParlAI dialogue_safety record; ``error`` locates problems."""
    if not isinstance(record, dict):
        raise error(f"expected a record object, found {type(record).__name__}")
    text = record.get("text")
    if not isinstance(text, str) or not text.strip():
        raise error("empty or missing 'text'")
    labels = record.get("labels", record.get("eval_labels"))
    if not isinstance(labels, list) or not labels:
        raise error("missing 'labels' (expected ['__ok__'] or ['__notok__'])")
    label = parlai_label(labels[0])
    if label is None:
        raise error(f"unknown label {labels[0]!r} in 'labels' (expected {OK_CLASS} or {NOT_OK_CLASS})")
    return text, label


def _mapping(value: Any, what: str, error: ErrorAt) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise error(f"expected an object of {what}, found {type(value).__name__}")
    return value


def _split(name: str, error: ErrorAt) -> Split:
    split = parse_split(name)
    if split is None:
        raise error(f"unknown split {name!r} (expected one of {split_names()})")
    return split


def single_turn_example(
    record: Any, *, kind: str, split: Split, round_: str, bucket: str, index: int, error: ErrorAt
) -> LabelledExample:
    """One single-turn record, checked against its ``good``/``bad`` bucket."""
    expected = _BUCKETS.get(bucket)
    if expected is None:
        raise error(f"unknown bucket {bucket!r} (expected good or bad)")
    text, label = parse_record(record, error)
    if label is not expected:
        raw = NOT_OK_CLASS if label.is_positive else OK_CLASS
        raise error(f"label {raw!r} disagrees with bucket {bucket!r}")
    return LabelledExample(
        utterance=text,
        label=label,
        source=SINGLE_TURN,
        split=split,
        family=LabelFamily.OFFENSIVE,
        task=f"{SINGLE_TURN}/{kind}",
        round=round_,
        metadata={"index": index},
    )


def multi_turn_example(record: Any, *, split: Split, index: int, error: ErrorAt) -> LabelledExample:
    """One multi-turn record: the last line of ``text`` is the utterance, the rest its history."""
    text, label = parse_record(record, error)
    *history, utterance = text.split("\n")
    if not utterance.strip():
        raise error("empty utterance (the last line of 'text')")
    return LabelledExample(
        utterance=utterance,
        history=tuple(Turn(line) for line in history),
        label=label,
        source=MULTI_TURN,
        split=split,
        family=LabelFamily.OFFENSIVE,
        metadata={"index": index},
    )


def read_single_turn(path: Path) -> Iterator[LabelledExample]:
    """Every record of ``single_turn_safety.json``, with its task, official split and round."""
    data = _mapping(read_json(path), "tasks", partial(DatasetFormatError, path, where="the top level"))
    for kind, splits in data.items():
        at = partial(DatasetFormatError, path, where=kind)
        if kind not in _KINDS:
            raise at(f"unknown task {kind!r} (expected standard or adversarial)")
        for split_name, rounds in _mapping(splits, "splits", at).items():
            at = partial(DatasetFormatError, path, where=f"{kind}.{split_name}")
            split = _split(split_name, at)
            for round_, buckets in _mapping(rounds, "rounds", at).items():
                at = partial(DatasetFormatError, path, where=f"{kind}.{split_name}.{round_}")
                if not round_.isdigit():
                    raise at(f"unknown round {round_!r} (expected 1, 2, 3, ...)")
                for bucket, records in _mapping(buckets, "buckets", at).items():
                    if not isinstance(records, list):
                        raise at(f"expected a list of records in {bucket!r}")
                    for index, record in enumerate(records):
                        where = f"{kind}.{split_name}.{round_}.{bucket}[{index}]"
                        yield single_turn_example(
                            record,
                            kind=kind,
                            split=split,
                            round_=round_,
                            bucket=bucket,
                            index=index,
                            error=partial(DatasetFormatError, path, where=where),
                        )


def read_multi_turn(path: Path) -> Iterator[LabelledExample]:
    """Every record of ``multi_turn_safety.json`` with its official split."""
    data = _mapping(read_json(path), "splits", partial(DatasetFormatError, path, where="the top level"))
    for split_name, records in data.items():
        at = partial(DatasetFormatError, path, where=split_name)
        split = _split(split_name, at)
        if not isinstance(records, list):
            raise at("expected a list of records")
        for index, record in enumerate(records):
            yield multi_turn_example(
                record,
                split=split,
                index=index,
                error=partial(DatasetFormatError, path, where=f"{split_name}[{index}]"),
            )


def read_samples(path: Path) -> Iterator[LabelledExample]:
    """The hand-transcribed ``sample_*.jsonl`` lines, parsed by the same record parser."""
    for line, item in read_jsonl(path):
        error = partial(DatasetFormatError, path, line=line)
        if not isinstance(item, dict) or not {"source_file", "json_path", "record"} <= item.keys():
            raise error("expected an object with source_file, json_path and record")
        source_file, json_path, record = item["source_file"], item["json_path"], item["record"]
        if not isinstance(json_path, list) or not json_path or not isinstance(json_path[-1], int):
            raise error(f"json_path must be a list ending in a record index, found {json_path!r}")
        if source_file == SINGLE_TURN_FILE and len(json_path) == 5:
            kind, split_name, round_, bucket, index = (str(p) for p in json_path)
            if kind not in _KINDS:
                raise error(f"unknown task {kind!r} in json_path (expected standard or adversarial)")
            yield single_turn_example(
                record,
                kind=kind,
                split=_split(split_name, error),
                round_=round_,
                bucket=bucket,
                index=int(index),
                error=error,
            )
        elif source_file == MULTI_TURN_FILE and len(json_path) == 2:
            split_name, index = (str(p) for p in json_path)
            yield multi_turn_example(record, split=_split(split_name, error), index=int(index), error=error)
        else:
            raise error(f"unexpected source_file/json_path {source_file!r} {json_path!r}")


def _find(data_dir: Path, file_name: str, sample_glob: str) -> SourceFiles:
    dirs = existing_dirs(data_dir, DIRS)
    path = find_file(dirs, [file_name])
    if path is not None:
        return SourceFiles(Status.COMPLETE, {"data": path})
    samples = sorted(p for folder in dirs for p in folder.glob(sample_glob))
    if samples:
        return SourceFiles(Status.SAMPLE, {f"sample{i}": p for i, p in enumerate(samples)}, _SAMPLE_NOTE)
    return SourceFiles.missing()


def find_single_turn(data_dir: Path) -> SourceFiles:
    return _find(data_dir, SINGLE_TURN_FILE, "sample_single_turn_safety*.jsonl")


def find_multi_turn(data_dir: Path) -> SourceFiles:
    return _find(data_dir, MULTI_TURN_FILE, "sample_multi_turn_safety*.jsonl")


def _load(found: SourceFiles, reader: Callable[[Path], Iterator[LabelledExample]]) -> Iterable[LabelledExample]:
    if "data" in found.files:
        yield from reader(found.files["data"])
        return
    for path in found.files.values():
        yield from read_samples(path)


def load_single_turn(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return (ex for ex in _load(found, read_single_turn) if ex.split in splits)


def load_multi_turn(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return (ex for ex in _load(found, read_multi_turn) if ex.split in splits)
