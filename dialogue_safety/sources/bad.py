"""Bot-Adversarial Dialogue (BAD; Xu et al., 2021; ParlAI task ``bot_adversarial_dialogue``).

The official files (ParlAI download ``dialogue_datasets_v0.2.tar.gz``) are
``bot_adversarial_dialogue_datasets_with_persona/{train,valid,test}.txt`` in ParlAI's text
format: one example per line, tab-separated ``key:value`` fields, with ``\\n``, ``\\t`` and
``__PIPE__`` escaping newline, tab and ``|`` inside values, and ``|`` separating list items.
Fields: ``text`` (the dialogue so far, turns separated by newlines), ``labels`` (or
``eval_labels``) ``__ok__``/``__notok__``, ``speaker_to_eval`` (``human``/``bot``),
``bot_persona``, ``episode_done``, ``id``.

The last line of ``text`` is the utterance, the :data:`BAD_NUM_TURNS` - 1 lines before it its
history (ParlAI's ``bad_num_turns``; earlier turns are not read). Speakers alternate and
the last line is spoken by ``speaker_to_eval``, which fixes the speaker of every history turn.
``__notok__`` is OFFENSIVE, as in BBF, in the family :data:`FAMILY`. Accepted layouts under the data directory:
``bot_adversarial_dialogue/dialogue_datasets/bot_adversarial_dialogue_datasets_with_persona/``
(ParlAI's data path), ``<dir>/bot_adversarial_dialogue_datasets_with_persona/`` or a flat
``<dir>/{train,valid,test}.txt`` with ``<dir>`` one of ``bot_adversarial_dialogue``,
``bot-adversarial-dialogue``, ``bad``. The shared ``bot-adversarial-dialogue-fixtures/`` folder
holds ParlAI's YAML regression fixtures only; they are reported as sample-only and not loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

from dialogue_safety.core.schema import LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.bbf import NOT_OK_CLASS, OK_CLASS, parlai_label
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import open_text
from dialogue_safety.sources.layout import (
    SourceFiles,
    Status,
    existing_dirs,
    find_files,
    read_split_files,
    split_status,
)

SOURCE = "bad"
DIRS = ("bot_adversarial_dialogue", "bot-adversarial-dialogue", "bad")
FIXTURE_DIR = "bot-adversarial-dialogue-fixtures"
PERSONA_DIR = "bot_adversarial_dialogue_datasets_with_persona"
SPEAKERS = ("human", "bot")
SPLIT_FILES = {"train": Split.TRAIN, "valid": Split.VALID, "test": Split.TEST}
# BAD's label is about a turn in its dialogue (a bot's "totally agree" is unsafe after hate only): the
# context's to decide, so with the decomposed verdict it teaches the context head (training/harmonise.py)
FAMILY = LabelFamily.UNSAFE_IN_CONTEXT
# turns read per example, the utterance included (ParlAI's bad_num_turns default, the published setting)
BAD_NUM_TURNS = 4

ErrorAt = Callable[[str], DatasetFormatError]


def unescape(value: str) -> str:
    """Undo ParlAI's text-format escaping of tab, newline and ``|``."""
    return value.replace("\\t", "\t").replace("\\n", "\n").replace("__PIPE__", "|")


def parse_line(line: str, error: ErrorAt) -> dict[str, str]:
    """The raw (still escaped) ``key:value`` fields of one ParlAI text-format line."""
    fields: dict[str, str] = {}
    for part in line.split("\t"):
        if not part:
            continue
        key, sep, value = part.partition(":")
        if not sep or not key:
            raise error(f"field {part[:40]!r} is not key:value")
        fields[key] = value
    return fields


def _speaker_of(distance_from_end: int, speaker_to_eval: str) -> str:
    other = SPEAKERS[1] if speaker_to_eval == SPEAKERS[0] else SPEAKERS[0]
    return speaker_to_eval if distance_from_end % 2 == 0 else other


def example_from_fields(fields: dict[str, str], split: Split, error: ErrorAt) -> LabelledExample:
    """One BAD example from the fields of a line."""
    if "text" not in fields:
        raise error("missing field 'text'")
    raw_labels = fields.get("labels", fields.get("eval_labels"))
    if raw_labels is None:
        raise error("missing field 'labels' (or 'eval_labels')")
    first = unescape(raw_labels.split("|")[0])
    label = parlai_label(first)
    if label is None:
        raise error(f"unknown label {first!r} in field labels (expected {OK_CLASS} or {NOT_OK_CLASS})")
    speaker = fields.get("speaker_to_eval", "")
    if speaker not in SPEAKERS:
        raise error(f"unknown speaker_to_eval {speaker!r} (expected human or bot)")
    *history, utterance = unescape(fields["text"]).split("\n")[-BAD_NUM_TURNS:]
    if not utterance.strip():
        raise error("empty utterance (the last line of text)")
    n = len(history)
    return LabelledExample(
        utterance=utterance,
        history=tuple(Turn(line, _speaker_of(n - i, speaker)) for i, line in enumerate(history)),
        label=label,
        source=SOURCE,
        split=split,
        family=FAMILY,
        metadata={
            "speaker_to_eval": speaker,
            "bot_persona": unescape(fields.get("bot_persona", "")),
            "id": unescape(fields.get("id", "")),
        },
    )


def read_file(path: Path, split: Split) -> Iterator[LabelledExample]:
    """Every example of one ParlAI text-format BAD file."""
    with open_text(path) as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            error = partial(DatasetFormatError, path, line=number)
            yield example_from_fields(parse_line(line, error), split, error)


def find(data_dir: Path) -> SourceFiles:
    roots = existing_dirs(data_dir, DIRS)
    dirs = [d for root in roots for d in (root / "dialogue_datasets" / PERSONA_DIR, root / PERSONA_DIR, root)]
    found = find_files(dirs, {name: [f"{name}.txt"] for name in SPLIT_FILES})
    status, note = split_status(found, SPLIT_FILES)
    if status is not Status.MISSING:
        return SourceFiles(status, found, note)
    fixtures = data_dir / FIXTURE_DIR
    if fixtures.is_dir() and any(fixtures.glob("*.yml")):
        return SourceFiles(
            Status.SAMPLE, {}, "ParlAI's YAML regression fixtures (first 5 examples per split), not loaded"
        )
    return SourceFiles.missing()


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return read_split_files(found, splits, SPLIT_FILES, read_file)
