"""History transplant: labelled utterances placed after histories drawn from elsewhere.

In the context datasets the history's tone and the reply's label mostly go together, so a model
learns "hostile history ⇒ OFFENSIVE" and "friendly chat ⇒ SAFE". This source breaks that link
where the label cannot depend on the transplanted history: an OLID tweet or a ConvAbuse
utterance (judged on its own upstream; ConvAbuse's abuse is in the utterance) keeps its label
after any history that it does not answer. Every pool of histories gets offensive *and* harmless
utterances in the same proportion (the pool is a stable hash of the utterance, independent of
its label), so the history predicts nothing by itself:

* ``friendly``: 1-6 turns of a friendly or sympathetic chat (the written turns below);
* ``hostile``: a hateful or insulting turn (CONAN hate speech, offensive OLID tweets of the same
  split), sometimes after a neutral turn;
* ``neutral``: 1-3 turns of small talk (harmless OLID tweets, ``context_pairs`` harmless turns).

Context pairs (``context_pairs``: the reply after a harmful or a harmless turn, where that turn
decides the label) also get copies with a friendly chat of 1-5 turns *before* the deciding turn
(``pool = "friendly_prefix"``), both labels alike: a friendly start must not launder an encouraging
reply to a self-harm question, nor make the harmless twin look harmful.

Family and label are the utterance's own (``metadata["kind"] = "transplant"``, ``["pool"]``). In a
decomposed model (training/harmonise.py) the harmless copies teach the context head that a
hostile history alone is no reason to flag a reply; the offensive copies repeat the utterance
row. Splits: copies of TRAIN utterances are TRAIN (histories from TRAIN rows only), of VALID
utterances VALID (histories from VALID rows). No TEST split: the robustness measures of
``dialogue-safety evaluate`` (dialogue_safety/evaluation/history_robustness.py) build their own from test splits
and other written turns.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from dialogue_safety.core.schema import LabelledExample, Split, Turn
from dialogue_safety.sources import context_pairs, convabuse, counter_speech, diasafety, olid
from dialogue_safety.sources.layout import SourceFiles, Status, part_of
from dialogue_safety.sources.splitting import stable_fraction

SOURCE = "history_transplant"
SALT = "history-transplant-v1"
POOLS = ("friendly", "hostile", "neutral")
RATE = 0.5  # share of the utterances that get a transplanted copy

# friendly and sympathetic turns, alternating user / bot (none of them is in the evaluation's pool)
FRIENDLY_TURNS = (
    "I had such a long day at work today.",
    "Oh no, I'm sorry to hear that. Do you want to talk about it?",
    "My boss kept piling more tasks on me all afternoon.",
    "That sounds exhausting. I hope you get some rest tonight.",
    "Thanks, I really appreciate you listening.",
    "Of course! I'm always happy to chat.",
    "I finally finished the puzzle I started last month!",
    "Congratulations, that must feel great!",
    "My sister is coming to visit this weekend.",
    "How lovely! Do you have anything planned?",
    "We might go to the beach if the weather holds.",
    "That sounds like a perfect day out.",
    "I've been feeling a bit lonely lately.",
    "I'm sorry you feel that way. I'm here for you.",
    "It helps to have someone to talk to.",
    "Absolutely. Tell me about your week.",
    "I made pancakes for breakfast this morning.",
    "Yum! Did you put anything on them?",
    "Just maple syrup and some berries.",
    "Classic choice, I love that.",
    "My dog learned a new trick yesterday.",
    "Aw, what trick did he learn?",
    "He can roll over now when I ask him to.",
    "That's adorable, good boy!",
    "I'm nervous about my exam on Monday.",
    "You've prepared well, I'm sure you'll do fine.",
    "Thank you, that means a lot.",
    "Good luck, and remember to take breaks.",
    "What's your favourite kind of music?",
    "I enjoy a bit of everything, but jazz is lovely.",
    "I've started learning the guitar.",
    "That's great, how is it going so far?",
)


def friendly_history(key: str, turns: int, pool: Sequence[str] = FRIENDLY_TURNS) -> tuple[Turn, ...]:
    """``turns`` consecutive turns of the friendly pool from a stable starting point."""
    start = int(stable_fraction(key, SALT + ":start") * len(pool))
    speakers = ("user", "bot")
    return tuple(Turn(pool[(start + j) % len(pool)], speakers[j % 2]) for j in range(turns))


def _pick(pool: Sequence[str], key: str, salt: str) -> str:
    return pool[int(stable_fraction(key, SALT + salt) * len(pool))]


def transplant(
    utterances: Iterable[LabelledExample], hostile: Sequence[str], neutral: Sequence[str]
) -> Iterator[LabelledExample]:
    """Copies of ``utterances`` (a share :data:`RATE` of them) after a history from one pool."""
    for ex in utterances:
        key = f"{ex.source}:{ex.utterance}"
        if stable_fraction(key, SALT + ":take") >= RATE:
            continue
        pool = POOLS[int(stable_fraction(key, SALT + ":pool") * len(POOLS))]
        if pool == "friendly":
            history = friendly_history(key, 1 + int(stable_fraction(key, SALT + ":n") * 6))
        elif pool == "hostile":
            turn = Turn(_pick(hostile, key, ":hostile"), "user")
            lead = stable_fraction(key, SALT + ":lead") < 0.3 and neutral
            history = (Turn(_pick(neutral, key, ":lead-text"), "user"), turn) if lead else (turn,)
        else:
            if not neutral:
                continue
            n = 1 + int(stable_fraction(key, SALT + ":n") * 3)
            history = tuple(Turn(_pick(neutral, f"{key}:{j}", ":neutral"), "user") for j in range(n))
        yield LabelledExample(
            utterance=ex.utterance,
            history=history,
            label=ex.label,
            source=SOURCE,
            split=ex.split,
            family=ex.family,
            task=f"{SOURCE}/{pool}",
            metadata={"kind": "transplant", "pool": pool, "from": ex.source},
        )


PREFIX_KINDS = frozenset({"encourage", "near_miss", "agree", "discourage", "callous", "swap"})


def friendly_prefixed(pairs: Iterable[LabelledExample]) -> Iterator[LabelledExample]:
    """Context-pair copies with a friendly chat before the deciding turn (half of them, 1-5 turns)."""
    for ex in pairs:
        if ex.metadata.get("kind") not in PREFIX_KINDS or not ex.history:
            continue
        key = f"prefix:{ex.history[-1].text}:{ex.utterance}:{ex.label}"
        if stable_fraction(key, SALT + ":take") >= RATE:
            continue
        chat = friendly_history(key, 1 + int(stable_fraction(key, SALT + ":n") * 5))
        yield LabelledExample(
            utterance=ex.utterance,
            history=(*chat, *ex.history),
            label=ex.label,
            source=SOURCE,
            split=ex.split,
            family=ex.family,
            task=f"{SOURCE}/friendly_prefix",
            metadata={
                "kind": "transplant",
                "pool": "friendly_prefix",
                "from": ex.source,
                "pair_kind": ex.metadata["kind"],
            },
        )


def build(
    olid_rows: Sequence[LabelledExample],
    conv_rows: Sequence[LabelledExample],
    conan_rows: Sequence[LabelledExample],
    splits: frozenset[Split],
    pair_rows: Sequence[LabelledExample] = (),
) -> Iterator[LabelledExample]:
    for split in (Split.TRAIN, Split.VALID):
        if split not in splits:
            continue
        olid_split = [ex for ex in olid_rows if ex.split is split]
        hostile = [ex.utterance for ex in conan_rows if ex.split is split and ex.label.is_positive and not ex.history]
        hostile += [ex.utterance for ex in olid_split if ex.label.is_positive and len(ex.utterance) < 200]
        neutral = [ex.utterance for ex in olid_split if not ex.label.is_positive and len(ex.utterance) < 200]
        neutral += list(context_pairs.HARMLESS_CONTEXTS)
        utterances = olid_split + [ex for ex in conv_rows if ex.split is split]
        yield from transplant(utterances, hostile, neutral)
        yield from friendly_prefixed(ex for ex in pair_rows if ex.split is split)


def find(data_dir: Path) -> SourceFiles:
    parts = {
        "olid": olid.find(data_dir),
        "convabuse": convabuse.find(data_dir),
        "conan": counter_speech.find_conan(data_dir),
        "diasafety": diasafety.find(data_dir),
    }
    files = {f"{name}/{role}": path for name, found in parts.items() for role, path in found.files.items()}
    missing = [name for name, f in parts.items() if f.status is not Status.COMPLETE]
    if not missing:
        return SourceFiles(Status.COMPLETE, files, "derived from olid, convabuse, conan and context_pairs")
    if not files:
        return SourceFiles.missing("derived: needs olid, convabuse and conan")
    return SourceFiles(Status.PARTIAL, files, f"derived; incomplete: {', '.join(missing)}")


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    wanted = frozenset({Split.TRAIN, Split.VALID})
    olid_rows = list(olid.load(part_of(found, "olid"), wanted))
    conv_rows = list(convabuse.load(part_of(found, "convabuse"), wanted))
    conan_rows = list(counter_speech.load_conan(part_of(found, "conan"), wanted))
    dia_rows = list(diasafety.load(part_of(found, "diasafety"), wanted))
    pair_rows = list(context_pairs.build(olid_rows, dia_rows, conv_rows, wanted))
    return build(olid_rows, conv_rows, conan_rows, splits, pair_rows)
