"""ToxicChat (Lin et al. 2023): real user prompts to a deployed chatbot, human-labelled.

Read from JUDGE-BENCH's conversion (``data/toxic_chat/toxic_chat_train.json``): a JSON object
whose ``instances`` are ``{"id", "instance": prompt, "annotations": {"toxicity":
{"majority_human": "0"|"1"}, "jailbreaking": {"majority_human": "0"|"1"}}}``. Only the
human-annotated rows of ToxicChat's **train** split are in it (the test split is withheld and
must never be trained on); labels are strings.

Mapping: ``toxicity`` "1" is OFFENSIVE, "0" SAFE. ToxicChat's toxicity is broad (requests for
sexual content, harassment, hate, violence or self-harm, as well as offensive text), which is the
served definition's reading of a user turn to a chatbot. Each prompt is one user turn with no
history; the family is UNSAFE_IN_CONTEXT (a harmful request is unsafe for what it asks a chatbot
to do, not for its words), which with no history teaches the utterance heads. ``metadata``
keeps ``jailbreaking``, ``kind="request"`` and ``unsafe_request`` (the toxicity label: every
prompt is a request to the chatbot). No validation split upstream: 80/10/10 by a stable
hash of the conversation id. The official test split, when a user supplies it in the same
format (``toxic_chat_test.json``), is read as TEST whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from dialogue_safety.core.schema import UNSAFE_REQUEST, Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_json
from dialogue_safety.sources.layout import SourceFiles, Status, existing_dirs, find_files, split_status
from dialogue_safety.sources.splitting import three_way_split

SOURCE = "toxicchat"
DIRS = ("toxicchat-train", "toxic_chat", "toxicchat")
FILES = {"train": ["toxic_chat_train.json"], "test": ["toxic_chat_test.json"]}
LABELS = {"1": Label.OFFENSIVE, "0": Label.SAFE}
SALT = "toxicchat-v1"
USER = "user"


def _majority(instance: dict[str, Any], metric: str, path: Path, index: int) -> str:
    try:
        value = instance["annotations"][metric]["majority_human"]
    except (KeyError, TypeError):
        raise DatasetFormatError(path, f"instance {index}: missing annotations.{metric}.majority_human") from None
    if value not in LABELS:
        raise DatasetFormatError(path, f"instance {index}: {metric} label {value!r} (expected '0' or '1')")
    return str(value)


def read_file(path: Path, splits: frozenset[Split], official_test: bool = False) -> Iterator[LabelledExample]:
    data = read_json(path)
    instances = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(instances, list):
        raise DatasetFormatError(path, "expected a JSON object with an 'instances' list", line=1)
    for index, instance in enumerate(instances):
        if not isinstance(instance, dict):
            raise DatasetFormatError(path, f"instance {index}: expected an object")
        text, key = instance.get("instance"), instance.get("id")
        if not isinstance(text, str) or not text.strip():
            raise DatasetFormatError(path, f"instance {index}: empty or missing 'instance' text")
        if not isinstance(key, str) or not key:
            raise DatasetFormatError(path, f"instance {index}: missing 'id'")
        toxicity = _majority(instance, "toxicity", path, index)
        jailbreaking = _majority(instance, "jailbreaking", path, index)
        split = Split.TEST if official_test else three_way_split(key, SALT)
        if split not in splits:
            continue
        yield LabelledExample(
            utterance=text.strip(),
            label=LABELS[toxicity],
            source=SOURCE,
            split=split,
            family=LabelFamily.UNSAFE_IN_CONTEXT,
            metadata={
                "id": key,
                "kind": "request",
                "jailbreaking": jailbreaking == "1",
                "speaker": USER,
                UNSAFE_REQUEST: toxicity == "1",
            },
        )


def find(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, DIRS), FILES)
    status, note = split_status(found, FILES)
    if status is Status.PARTIAL and "test" not in found:
        note = "ToxicChat's train split only (the official test split is withheld)"
    return SourceFiles(status, found, note)


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    for role in FILES:
        if (path := found.files.get(role)) is not None:
            yield from read_file(path, splits, official_test=role == "test")
