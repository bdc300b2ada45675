"""The benchmarks' dialogues: the DiaSafety + ConvAbuse test splits, or synthetic ones when missing.

One owner of the benchmark data: the runtime, HTTP and corpus-scoring benchmarks all measure on
:func:`load_dialogues`.
"""

from __future__ import annotations

import random
from pathlib import Path

from dialogue_safety.core.schema import Example

DIALOGUE_SOURCES = ("diasafety", "convabuse")


def load_dialogues(
    data_dir: str | Path | None, limit: int, seed: int = 0, split: str = "test"
) -> tuple[list[Example], str]:
    """DiaSafety + ConvAbuse dialogues of ``split`` (shuffled, at most ``limit``), or synthetic ones, and a note."""
    examples: list[Example] = []
    notes: list[str] = []
    try:
        from dialogue_safety.sources.registry import load_present_sources
    except ImportError as exc:
        notes.append(f"dialogue_safety.sources is not importable ({exc})")
    else:
        try:
            present = load_present_sources(DIALOGUE_SOURCES, data_dir, splits=[split])
        except FileNotFoundError as exc:  # no data directory; a malformed file still raises
            notes.append(str(exc))
        else:
            # the API refuses empty utterances (DiaSafety has one empty test response)
            examples = [ex.as_example() for rows in present.examples.values() for ex in rows if ex.utterance.strip()]
            notes += [f"{name}: {why}" for name, why in present.skipped.items()]
    if examples:
        random.Random(seed).shuffle(examples)
        note = f"{'+'.join(DIALOGUE_SOURCES)} {split} splits ({min(limit, len(examples))} dialogues)"
        return examples[:limit], note + (f"; skipped: {'; '.join(notes)}" if notes else "")
    return synthetic_dialogues(limit, seed), "SYNTHETIC dialogues (no dataset available: " + "; ".join(notes) + ")"


TEXT = (
    "you are so kind thanks what do think about my new haircut it looks terrible honestly people like that "
    "should never be allowed here I love this song the weather is nice today why would anyone say such a "
    "stupid thing go away nobody wants you around lets talk about football instead sure"
)


WORDS = TEXT.split()


def synthetic_dialogues(n: int, seed: int = 0) -> list[Example]:
    """Dialogues of 0-3 history turns and 4-24-word sentences (~50 tokens on average, like the test sets)."""
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))

    return [Example.from_texts(sentence(), [sentence() for _ in range(rng.randint(0, 3))]) for _ in range(n)]
