"""A bot's harmless reply after an abusive or unsafe user turn: SAFE in its context (derived, natural text).

A backend that screens its chatbot's output must not block the bot's good behaviour: 0.5.0 scores a
polite, deflecting reply 0.01 alone and 0.83 after an abusive user turn (issue 52). The reply does not
inherit its context's hostility, and two corpora hold real bot replies after real abuse:

* ``convabuse_replies`` (ConvAbuse, CC BY 4.0): every ConvAbuse row carries the agent's turn
  (``agent``) after a user turn (``prev_user``). That user turn is labelled where it is the ``user``
  of a row: the label of a turn is the one its rows give (:func:`turn_labels`; rows that disagree leave
  it unlabelled). A reply after a turn labelled abusive is a row here, with the two turns before it as
  its history (``prev_agent``, ``prev_user``). The bots are E.L.I.Z.A. ("Please go on.") and CarbonBot
  ("I don't have to put up with any abuse from you.").
* ``bad_replies`` (BAD's validation split as ``bad_fsb`` reads it): a bot turn that BAD labels OK after
  a human turn that BAD labels not OK (the label of the human turn is the one its own record gives,
  found by the turn and the turn before it, :func:`human_turn_labels`). These are the bot's topic changes,
  refusals and disagreements ("Hey do you want to talk about something else? How about we talk about
  zebras?"), with the 3 turns before them as ``bad_fsb`` reads every record.

Checked against the corpora's own labels (traps):

* **Echoes**: the agent replies are not rated in ConvAbuse, and E.L.I.Z.A. reflects the user's words back
  ("Does it please you to believe I am stupid?", "Oh, i suck."): a reply that shares a word of
  :data:`ECHO_LETTERS` letters or more (other than "you", "have" and the like), or two words in a row, with
  the turn it answers is left out (:func:`echoes`), and so is a reply whose text is a user turn the corpus
  labels abusive;
* **Unsafe elsewhere**: a BAD bot reply whose text BAD labels not OK in another record is left out
  (a generic "I agree" is OK after one turn and not OK after another);
* **Test splits**: rows come from the corpora's train and validation splits only (ConvAbuse's official
  ones; ``bad_fsb``'s split by dialogue), and labels are read from those splits only. The measure of the
  bot's reply after abuse (``dialogue_safety/evaluation/history_robustness.py``) reads the test splits
  with the same functions.

Family *unsafe in context*, label SAFE: in a decomposed model (training/harmonise.py) the reply teaches the
context head 0 after the hostile turn, and the utterance heads 0. ``metadata``: ``kind`` (``after_abuse``),
``bot`` (ConvAbuse) or ``speaker`` (BAD), ``answered`` (the turn the reply answers).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources import bad_fsb, convabuse
from dialogue_safety.sources.layout import SourceFiles, derived_from, load_parts

CONVABUSE = "convabuse_replies"
BAD = "bad_replies"
AFTER_ABUSE = "after_abuse"
AGENT, USER = "agent", "user"  # ConvAbuse's speakers (convabuse.CONTEXT_COLUMNS)
HUMAN, BOT = bad_fsb.SPEAKERS
LABELLED = frozenset({Split.TRAIN, Split.VALID})  # the splits rows and labels come from
ECHO_LETTERS = 3  # a shared word this long (letters) marks a reply that repeats the turn it answers
# ... unless it is one of these, which any reply may share with any turn
ECHO_IGNORED = frozenset(
    "you your yours are the and not for have has had with from that this was were can all any".split()  # noqa: SIM905
)
_WORD = re.compile(r"[^\W\d_]+")


def normalised(text: str) -> str:
    """The text as turns are compared: case-folded, whitespace collapsed."""
    return " ".join(text.casefold().split())


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


def echoes(reply: str, turn: str) -> bool:
    """Whether ``reply`` repeats words of ``turn``: a shared word of :data:`ECHO_LETTERS`+ letters (not one of
    :data:`ECHO_IGNORED`), or two words in a row (E.L.I.Z.A.'s reflections: "you are gay" -> "Does it please
    you to believe I am gay?")."""
    said, answer = _words(turn), _words(reply)
    if {w for w in said if len(w) >= ECHO_LETTERS} & {w for w in answer if len(w) >= ECHO_LETTERS} - ECHO_IGNORED:
        return True
    return bool(set(zip(said, said[1:], strict=False)) & set(zip(answer, answer[1:], strict=False)))


def turn_labels(rows: Iterable[LabelledExample]) -> dict[str, Label]:
    """The label of each utterance (normalised) that the rows agree on; a text the rows label both ways
    is left out."""
    seen: dict[str, set[Label]] = defaultdict(set)
    for ex in rows:
        seen[normalised(ex.utterance)].add(ex.label)
    return {text: next(iter(labels)) for text, labels in seen.items() if len(labels) == 1}


@dataclass(frozen=True)
class Reply:
    """A bot's reply with the turns before it, and the corpus label of the turn it answers (None: not
    labelled, or labelled both ways)."""

    reply: str
    history: tuple[Turn, ...]
    answered: Label | None
    row: LabelledExample


def agent_replies(rows: Sequence[LabelledExample]) -> list[Reply]:
    """The ConvAbuse agents' replies in ``rows`` that repeat nothing of the turn they answer, each with the
    label ``rows`` give that turn (replies whose text ``rows`` label abusive are left out)."""
    labels = turn_labels(rows)
    out = []
    for ex in rows:
        history = ex.history
        if len(history) < 2 or history[-1].speaker != AGENT or history[-2].speaker != USER:
            continue
        reply, answered = history[-1].text.strip(), history[-2].text
        if not reply or echoes(reply, answered) or labels.get(normalised(reply)) is Label.OFFENSIVE:
            continue
        out.append(Reply(reply, history[:-1], labels.get(normalised(answered)), ex))
    return out


def human_turn_labels(rows: Iterable[LabelledExample]) -> dict[tuple[str, str], Label]:
    """BAD's label of each human turn, keyed by (the turn before it, the turn), both normalised; a key
    labelled both ways is left out."""
    seen: dict[tuple[str, str], set[Label]] = defaultdict(set)
    for ex in rows:
        if ex.metadata.get("speaker") == HUMAN:
            before = ex.history[-1].text if ex.history else ""
            seen[(normalised(before), normalised(ex.utterance))].add(ex.label)
    return {key: next(iter(labels)) for key, labels in seen.items() if len(labels) == 1}


def bot_turns(rows: Sequence[LabelledExample]) -> list[Reply]:
    """BAD's bot turns labelled OK in ``rows`` (``bad_fsb`` rows), each with the label BAD gives the human
    turn it answers; a reply whose text BAD labels not OK in another record is left out."""
    humans = human_turn_labels(rows)
    unsafe = {normalised(ex.utterance) for ex in rows if ex.metadata.get("speaker") == BOT and ex.label.is_positive}
    out = []
    for ex in rows:
        if ex.metadata.get("speaker") != BOT or ex.label.is_positive or not ex.history:
            continue
        if normalised(ex.utterance) in unsafe:
            continue
        before = ex.history[-2].text if len(ex.history) > 1 else ""
        answered = humans.get((normalised(before), normalised(ex.history[-1].text)))
        out.append(Reply(ex.utterance, ex.history, answered, ex))
    return out


def _example(reply: Reply, source: str, split: Split, metadata: dict[str, object]) -> LabelledExample:
    return LabelledExample(
        utterance=reply.reply,
        history=reply.history,
        label=Label.SAFE,
        source=source,
        split=split,
        family=LabelFamily.UNSAFE_IN_CONTEXT,
        metadata={"kind": AFTER_ABUSE, "answered": reply.history[-1].text, **metadata},
    )


def build_convabuse(rows: Sequence[LabelledExample], splits: frozenset[Split]) -> Iterator[LabelledExample]:
    """SAFE-in-context rows: the agent's reply after a user turn labelled abusive, from train and valid rows."""
    for reply in agent_replies([ex for ex in rows if ex.split in LABELLED]):
        if reply.answered is Label.OFFENSIVE and reply.row.split in splits:
            yield _example(reply, CONVABUSE, reply.row.split, {"bot": reply.row.metadata.get("bot")})


def build_bad(rows: Sequence[LabelledExample], splits: frozenset[Split]) -> Iterator[LabelledExample]:
    """SAFE-in-context rows: BAD's OK bot turns after a not-OK human turn, from ``bad_fsb``'s train and valid."""
    for reply in bot_turns([ex for ex in rows if ex.split in LABELLED]):
        if reply.answered is Label.OFFENSIVE and reply.row.split in splits:
            yield _example(reply, BAD, reply.row.split, {"speaker": BOT})


def find_convabuse(data_dir: Path) -> SourceFiles:
    return derived_from({"convabuse": convabuse.find(data_dir)})


def load_convabuse(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    # labels are read from train and valid whatever is asked for, so a row does not depend on the splits asked
    return build_convabuse(load_parts(found, {"convabuse": convabuse.load}, LABELLED), splits)


def find_bad(data_dir: Path) -> SourceFiles:
    return derived_from({"bad_fsb": bad_fsb.find(data_dir)})


def load_bad(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return build_bad(load_parts(found, {"bad_fsb": bad_fsb.load}, LABELLED), splits)
