"""The context pool a round draws from: safe conversations from the sources' train splits, or a file.

A task with context shows the player a dialogue drawn from the round's pool; ``dialogue-safety
break-it new-round`` / ``add-contexts`` fill it from the sources with real dialogue history
(:data:`POOL_SOURCES`, :func:`safe_contexts`) or from a JSON-lines file (:func:`read_pool`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import Label, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_jsonl

POOL_SOURCES = ("diasafety", "convabuse", "bbf_multi_turn", "bad")  # sources with real dialogue history

#: a turn made only of these words is a placeholder (a bot's "ok", a user's "restart Hey"), not conversation
PLACEHOLDER_WORDS = frozenset(
    [
        "ok",
        "okay",
        "k",
        "kk",
        "yes",
        "yeah",
        "yep",
        "no",
        "nope",
        "hi",
        "hey",
        "hello",
        "hallo",
        "yo",
        "restart",
        "start",
        "stop",
        "reset",
        "test",
        "testing",
        "bye",
        "hmm",
        "hm",
        "lol",
        "what",
        "huh",
        "sure",
        "thanks",
        "thx",
        "ty",
    ]
)
MIN_TURN_WORDS = 3  # a turn that says something
MIN_SUBSTANTIVE_TURNS = 2
MIN_WORDS = 10  # in the whole conversation


def _words(text: str) -> list[str]:
    return [w for w in (w.strip(".,!?;:'\"()[]-…").lower() for w in text.split()) if w]


def is_placeholder(text: str) -> bool:
    words = _words(text)
    return not words or all(w in PLACEHOLDER_WORDS for w in words)


def is_conversation(turns: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a context is a conversation worth attacking in: at least two turns, none a
    placeholder, at least two that say something (3+ words), 10+ words in all. Drops what the
    sources hold besides conversations: "agent: ok / user: restart Hey", one-word exchanges."""
    texts = [str(t.get("text", "")) for t in turns]
    if len(texts) < 2 or any(is_placeholder(t) for t in texts):
        return False
    lengths = [len(_words(t)) for t in texts]
    return sum(n >= MIN_TURN_WORDS for n in lengths) >= MIN_SUBSTANTIVE_TURNS and sum(lengths) >= MIN_WORDS


def safe_contexts(
    names: Iterable[str], data_dir: Path | str | None, size: int, seed: int = 0, *, conversations_only: bool = True
) -> list[list[dict[str, str | None]]]:
    """Up to ``size`` safe conversations (turns, oldest first) from the train splits of ``names``: a SAFE
    example with at least one history turn, its utterance appended as the last turn, that
    :func:`is_conversation` (unless ``conversations_only`` is false: the pools drawn before that
    filter, such as the demo round's). Sampled with ``seed``, deduplicated."""
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
            if key not in seen and (not conversations_only or is_conversation([{"text": t.text} for t in turns])):
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
