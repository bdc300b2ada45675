"""Unsafe advice in replies: a user's situation or question, then advice that is safe or not.

The harm is in what the reply tells the user to do given the situation, usually without one
offensive word, so both sources are family UNSAFE_IN_CONTEXT: the reply after its context
teaches the context head (unsafe 1, safe 0), and a safe reply teaches the utterance heads 0.

``safetext`` (SafeText, Levy et al. 2022, MIT): one JSON object keyed by a **scenario** that is
the start of a sentence ("If you're on a hike ... and you see a colorful mushroom,"), each value
``{"safe": [advice], "unsafe": [advice]}`` whose strings finish that sentence ("taste it.").
Trap: fragments. The scenario becomes a user turn, :data:`SAFETEXT_QUESTION` (the sentence
turned into a question), and the advice a bot reply, :data:`SAFETEXT_REPLY` (capitalised and
made a full sentence), the same template for both labels so that it predicts nothing. Split
80/10/10 by a stable hash of the scenario.

``medical_safety`` (Abercrombie & Rieser 2022, GPL-3.0; ``medicheck-expert.csv``): r/AskDocs
queries with a DialoGPT, an Alexa and a Reddit reply, each graded by a clinician: ``0`` no answer
or irrelevant, ``1`` general information, ``2`` recommendations, ``3`` treatment or diagnosis,
``X`` nonsensical, empty = no reply. The query is graded ``0`` not medical, ``1`` non-serious,
``2`` serious, ``3`` critical. Mapping: a reply graded 3 (a chatbot diagnosing or prescribing)
is unsafe; a reply graded 2 is unsafe after a serious or critical query and not used after a
non-serious one (whether a recommendation is risky there is the grader's open question);
0, 1 and X are safe; empty cells are no example. Trap: the header ``response-reddit`` has a
trailing space (read by its stripped name). The crowd file (overlapping queries, named
categories) and the unlabelled negatives are not read. Split 80/10/10 by a stable hash of the query.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.files import read_csv, read_json
from dialogue_safety.sources.layout import SourceFiles, existing_dirs, find_files, split_status
from dialogue_safety.sources.splitting import three_way_split

SAFETEXT = "safetext"
MEDICAL_SAFETY = "medical_safety"
SAFETEXT_DIRS = ("safetext", "SafeText")
MEDICAL_DIRS = ("medical-safety", "medical_safety")
USER, BOT = "user", "bot"

SAFETEXT_QUESTION = "{scenario} what should I do?"
SAFETEXT_REPLY = "You should {advice}"

MEDICAL_RESPONDERS = ("dialogpt", "alexa", "reddit")
SERIOUS_QUERY = frozenset({"2", "3"})
MEDICAL_GRADES = frozenset({"0", "1", "2", "3", "X"})


def safetext_turns(scenario: str, advice: str) -> tuple[str, str]:
    """The (user turn, bot reply) a SafeText scenario and one of its advice fragments make."""
    question = SAFETEXT_QUESTION.format(scenario=scenario.strip().rstrip(",;:").strip() + ",")
    advice = advice.strip()
    reply = SAFETEXT_REPLY.format(advice=advice[:1].lower() + advice[1:])
    if reply[-1] not in ".!?":
        reply += "."
    return question, reply


def read_safetext(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise DatasetFormatError(path, "expected one JSON object keyed by scenario", line=1)
    for scenario, advice in data.items():
        if not isinstance(advice, dict) or not all(isinstance(advice.get(k), list) for k in ("safe", "unsafe")):
            raise DatasetFormatError(path, f"scenario {scenario[:60]!r}: expected lists 'safe' and 'unsafe'")
        split = three_way_split(scenario, "safetext-v1")
        if split not in splits:
            continue
        for key, label in (("unsafe", Label.OFFENSIVE), ("safe", Label.SAFE)):
            for fragment in advice[key]:
                if not isinstance(fragment, str) or not fragment.strip():
                    raise DatasetFormatError(path, f"scenario {scenario[:60]!r}: empty {key} advice")
                question, reply = safetext_turns(scenario, fragment)
                yield LabelledExample(
                    utterance=reply,
                    history=(Turn(question, USER),),
                    label=label,
                    source=SAFETEXT,
                    split=split,
                    family=LabelFamily.UNSAFE_IN_CONTEXT,
                    metadata={"kind": "advice", "scenario": scenario},
                )


def medical_label(query_grade: str, reply_grade: str) -> Label | None:
    """The label of a reply graded ``reply_grade`` to a query graded ``query_grade`` (None: not used)."""
    if reply_grade == "3" or (reply_grade == "2" and query_grade in SERIOUS_QUERY):
        return Label.OFFENSIVE
    if reply_grade == "2":
        return None
    return Label.SAFE


def read_medical(path: Path, splits: frozenset[Split]) -> Iterator[LabelledExample]:
    required = ["query", "query-label-expert"] + [
        f"response-{r}{suffix}" for r in MEDICAL_RESPONDERS for suffix in ("", "-label-expert")
    ]
    columns: dict[str, int] = {}
    for row in read_csv(path):
        if not columns:  # by stripped name: upstream's "response-reddit " has a trailing space
            columns = {name.strip(): i for i, name in reversed(list(enumerate(row.header)))}
            missing = [c for c in required if c not in columns]
            if missing:
                raise DatasetFormatError(path, f"missing column {', '.join(missing)}", line=1)
        query = row.fields[columns["query"]].strip()
        query_grade = row.fields[columns["query-label-expert"]].strip()
        if not query:
            raise row.error("empty query")
        split = three_way_split(query, "medical-safety-v1")
        if split not in splits:
            continue
        for responder in MEDICAL_RESPONDERS:
            reply = row.fields[columns[f"response-{responder}"]].strip()
            grade = row.fields[columns[f"response-{responder}-label-expert"]].strip()
            if not reply or not grade:
                continue
            if grade not in MEDICAL_GRADES:
                raise row.error(f"unknown grade {grade!r} for the {responder} reply (expected 0-3 or X)")
            label = medical_label(query_grade, grade)
            if label is None:
                continue
            yield LabelledExample(
                utterance=reply,
                history=(Turn(query, USER),),
                label=label,
                source=MEDICAL_SAFETY,
                split=split,
                family=LabelFamily.UNSAFE_IN_CONTEXT,
                task=f"{MEDICAL_SAFETY}/{responder}",
                metadata={"kind": "advice", "query_grade": query_grade, "reply_grade": grade, "line": row.line},
            )


def find_safetext(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, SAFETEXT_DIRS), {"all": ["SafeText.json"]})
    status, note = split_status(found, ["all"])
    return SourceFiles(status, found, note)


def load_safetext(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    path = found.files.get("all")
    return read_safetext(path, splits) if path is not None else ()


def find_medical(data_dir: Path) -> SourceFiles:
    found = find_files(existing_dirs(data_dir, MEDICAL_DIRS), {"expert": ["medicheck-expert.csv"]})
    status, note = split_status(found, ["expert"])
    return SourceFiles(status, found, note)


def load_medical(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    path = found.files.get("expert")
    return read_medical(path, splits) if path is not None else ()
