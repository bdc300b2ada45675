"""Threats: a threat or wish of harm at a person is offensive; the same verb in its everyday sense is not.

The chatbot-safety sources teach that violent words are often harmless (game chat, Gab and Reddit
posts labelled for one thing only), and a model trained on them learns it too well: 0.5.0 scores
plain threats at a person or an unnamed group SAFE where no protected group is named (card
limitations). This written source (its sentences in ``written/threats.tsv``, columns ``verb, label, text``, read by
:mod:`dialogue_safety.sources.written`) gives each of its verbs threats and wishes of harm at
"you", a relative, "that guy" or "those people" (OFFENSIVE, ``metadata["violence"]`` true) and
look-alikes that use the verb in a kitchen, sport, work or figurative sense (SAFE, ``violence``
false), so the verb alone decides nothing; "I'm going to <verb> ..." is written with both labels (a
continued stage on threats alone taught the frame: "I'm going to kill it at the interview" went SAFE →
OFFENSIVE). Family OFFENSIVE: the utterance heads learn them, and the
``violence`` head gets rows that label it. Split 80/10/10 by a stable hash of the verb, so
validation and test measure verbs never trained on.

Written for this project, apart from the probes: ``tests/test_threats_source.py`` checks that no
text here is a probe of ``tests/test_model_probes.py`` or a context-flip suite text, and the verbs of
the probes' threats (kill, die, hurt, slit, death) are not used here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import VIOLENCE, Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.layout import SourceFiles, Status
from dialogue_safety.sources.splitting import three_way_split
from dialogue_safety.sources.written import read_written, written_path

SOURCE = "threats"
SALT = "threats-v4"  # the first salt that gives validation two verbs and test three
KEY = "verb"
FILE = written_path(SOURCE)

Pairs = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def pairs(path: Path = FILE) -> Pairs:
    """verb -> (threats and wishes of harm at a person or an unnamed group, look-alikes using the verb
    harmlessly), in file order."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for row in read_written(path, KEY):
        threats, look_alikes = out.setdefault(row.key, ([], []))
        (threats if row.label.is_positive else look_alikes).append(row.text)
    return {verb: (tuple(threats), tuple(look_alikes)) for verb, (threats, look_alikes) in out.items()}


def _example(verb: str, split: Split, utterance: str, label: Label) -> LabelledExample:
    return LabelledExample(
        utterance=utterance,
        label=label,
        source=SOURCE,
        split=split,
        family=LabelFamily.OFFENSIVE,
        metadata={"verb": verb, VIOLENCE: label.is_positive},
    )


def examples(splits: frozenset[Split], path: Path = FILE) -> Iterator[LabelledExample]:
    for verb, (threats, look_alikes) in pairs(path).items():
        split = three_way_split(verb, SALT)
        if split not in splits:
            continue
        for text in threats:
            yield _example(verb, split, text, Label.OFFENSIVE)
        for text in look_alikes:
            yield _example(verb, split, text, Label.SAFE)


def find(data_dir: Path) -> SourceFiles:
    return SourceFiles(Status.COMPLETE, {"sentences": FILE}, f"written: {FILE.parent.name}/{FILE.name} in the package")


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return examples(splits, found.files.get("sentences", FILE))
