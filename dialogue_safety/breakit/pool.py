"""The context pool a round draws from: safe conversations from the sources' train splits, or a file.

A task with context shows the player a dialogue drawn from the round's pool; ``dialogue-safety
break-it new-round`` / ``add-contexts`` fill it from the sources with real dialogue history
(:data:`POOL_SOURCES`, :func:`safe_contexts`) or from a JSON-lines file (:func:`read_pool`).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from dialogue_safety.core.schema import Label, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_jsonl

POOL_SOURCES = ("diasafety", "convabuse", "bbf_multi_turn", "bad")  # sources with real dialogue history


def safe_contexts(
    names: Iterable[str], data_dir: Path | str | None, size: int, seed: int = 0
) -> list[list[dict[str, str | None]]]:
    """Up to ``size`` safe conversations (turns, oldest first) from the train splits of ``names``: a SAFE
    example with at least one history turn, its utterance appended as the last turn. Sampled
    with ``seed``, deduplicated."""
    import random

    from dialogue_safety.sources.registry import load_source

    seen: set[tuple[str, ...]] = set()
    pool: list[list[dict[str, str | None]]] = []
    for name in names:
        for ex in load_source(name, data_dir, splits=[Split.TRAIN]):
            if ex.label is not Label.SAFE or not ex.history or not ex.utterance.strip():
                continue
            if any(not t.text.strip() for t in ex.history):
                continue
            reply_speaker = {"user": "bot", "bot": "user", "agent": "user"}.get(ex.history[-1].speaker or "")
            turns = [*ex.history, Turn(ex.utterance, reply_speaker)]
            key = tuple(t.text for t in turns)
            if key not in seen:
                seen.add(key)
                pool.append([{"speaker": t.speaker, "text": t.text} for t in turns])
    random.Random(seed).shuffle(pool)
    return pool[:size]


def read_pool(path: Path) -> list[list[dict[str, str | None]]]:
    """A pool file: JSON lines, each a list of turns (strings or ``{"speaker", "text"}``) or ``{"turns": [...]}``."""
    pool = []
    for line, obj in read_jsonl(path):
        turns = obj.get("turns") if isinstance(obj, dict) else obj
        if not isinstance(turns, list) or not turns:
            raise DatasetFormatError(path, 'expected a non-empty list of turns (or {"turns": [...]})', line=line)
        context = []
        for i, turn in enumerate(turns):
            if isinstance(turn, str) and turn.strip():
                context.append({"speaker": None, "text": turn})
            elif isinstance(turn, dict) and isinstance(turn.get("text"), str) and turn["text"].strip():
                speaker = turn.get("speaker")
                context.append({"speaker": None if speaker is None else str(speaker), "text": turn["text"]})
            else:
                raise DatasetFormatError(
                    path, f"turn {i} must be a non-empty string or have a non-empty 'text'", line=line
                )
        pool.append(context)
    return pool
