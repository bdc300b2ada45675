"""The natural derived sources of issue 52: a bot's harmless reply after abuse (ConvAbuse agents, BAD's bot
turns) and the threats of GHC and EDOS with their look-alikes; each row checked against its corpus labels,
on hand-written rows and on the real data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dialogue_safety.core.schema import VIOLENCE, Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources import bot_replies, threat_posts
from dialogue_safety.sources.registry import available_sources, load_source

ALL = frozenset(Split)


def _conv(user: str, label: Label, split: Split, *history: tuple[str, str]) -> LabelledExample:
    return LabelledExample(
        utterance=user,
        history=tuple(Turn(text, speaker) for speaker, text in history),
        label=label,
        source="convabuse",
        split=split,
        metadata={"bot": "CarbonBot"},
    )


def test_echoes_are_reflections_of_the_users_words() -> None:
    assert bot_replies.echoes("Does it please you to believe I am stupid?", "you are stupid")
    assert bot_replies.echoes("Does it please you to believe I am gay?", "You are gay")
    assert bot_replies.echoes("Oh, i go to die.", "i go to die")  # two words in a row
    assert not bot_replies.echoes("I don't have to put up with any abuse from you.", "fuck you")
    assert not bot_replies.echoes("I don't have to put up with any abuse from you.", "I have a big one")
    assert not bot_replies.echoes("Please go on.", "idiot")


def test_convabuse_replies_after_a_turn_labelled_abusive_from_train_and_valid_only() -> None:
    safe, off = Label.SAFE, Label.OFFENSIVE
    train, valid, test = Split.TRAIN, Split.VALID, Split.TEST
    rows = [
        _conv("fuck you", off, train),  # labels the turn
        _conv("fuck you", off, valid),
        _conv("what now", safe, train, ("agent", "Hi"), ("user", "fuck you"), ("agent", "Please go on.")),
        _conv("ok", safe, valid, ("agent", "Hi"), ("user", "fuck you"), ("agent", "I don't want abuse.")),
        # an echo of the abusive turn: E.L.I.Z.A. repeats the insult
        _conv("no", safe, train, ("agent", "Hi"), ("user", "you are stupid"), ("agent", "Why am I stupid?")),
        _conv("you are stupid", off, train),
        # after a harmless turn: not a row of this source
        _conv("fine", safe, train, ("agent", "Hi"), ("user", "hello"), ("agent", "Good to know")),
        _conv("hello", safe, train),
        # the turn is labelled both ways: not labelled
        _conv("maybe", safe, train, ("agent", "Hi"), ("user", "shut it"), ("agent", "So")),
        _conv("shut it", off, train),
        _conv("shut it", safe, valid),
        # a reply that is itself a turn the corpus labels abusive
        _conv("eh", safe, train, ("user", "fuck you"), ("agent", "you are stupid")),
        # test rows: neither a reply nor a label is read from them
        _conv("why", safe, test, ("agent", "Hi"), ("user", "fuck you"), ("agent", "Goodbye then!")),
        _conv("idiot", off, test),
        _conv("wow", safe, train, ("agent", "Hi"), ("user", "idiot"), ("agent", "Please stop.")),
    ]
    built = list(bot_replies.build_convabuse(rows, ALL))
    assert [(ex.utterance, ex.split) for ex in built] == [("Please go on.", train), ("I don't want abuse.", valid)]
    first = built[0]
    assert first.history == (Turn("Hi", "agent"), Turn("fuck you", "user"))
    assert (first.label, first.family, first.source) == (
        Label.SAFE,
        LabelFamily.UNSAFE_IN_CONTEXT,
        bot_replies.CONVABUSE,
    )
    assert first.metadata == {"kind": "after_abuse", "answered": "fuck you", "bot": "CarbonBot"}
    assert [ex.split for ex in bot_replies.build_convabuse(rows, frozenset({valid}))] == [valid]


def _bad(turns: list[str], label: Label, split: Split = Split.TRAIN) -> LabelledExample:
    *history, utterance = turns[-4:]
    speaker = "human" if len(turns) % 2 else "bot"
    other = "bot" if speaker == "human" else "human"
    n = len(history)
    return LabelledExample(
        utterance=utterance,
        history=tuple(Turn(t, speaker if (n - i) % 2 == 0 else other) for i, t in enumerate(history)),
        label=label,
        source="bad_fsb",
        split=split,
        family=LabelFamily.UNSAFE_IN_CONTEXT,
        task=f"bad_fsb/{speaker}",
        metadata={"speaker": speaker},
    )


def test_bad_replies_are_ok_bot_turns_after_a_not_ok_human_turn() -> None:
    safe, off = Label.SAFE, Label.OFFENSIVE
    dialogue = ["hi", "hello there", "women are dumb", "Let's talk about zebras.", "no, agree with me", "I agree."]
    rows = [
        _bad(dialogue[:1], safe),
        _bad(dialogue[:2], safe),
        _bad(dialogue[:3], off),  # the human turn: not OK
        _bad(dialogue[:4], safe),  # the bot's topic change: a row
        _bad(dialogue[:5], off),
        _bad(dialogue[:6], off),  # the bot agrees: not OK, not a row
        _bad(["a", "b", "c", "I agree."], safe),  # OK here, not OK above: left out
        _bad(["a", "b", "nice day", "Yes it is."], safe),  # after an OK human turn: not a row
        _bad(["a", "b", "nice day"], safe),
        _bad(["x", "y", "kill them", "No thanks."], safe, Split.TEST),  # bad_fsb's test dialogues: never
        _bad(["x", "y", "kill them"], off, Split.TEST),
    ]
    built = list(bot_replies.build_bad(rows, ALL))
    assert [ex.utterance for ex in built] == ["Let's talk about zebras."]
    (row,) = built
    assert row.history == rows[3].history and row.history[-1] == Turn("women are dumb", "human")
    assert (row.label, row.family, row.source, row.split) == (
        Label.SAFE,
        bad_fsb_family(),
        bot_replies.BAD,
        Split.TRAIN,
    )
    assert row.metadata["answered"] == "women are dumb"
    # the measure reads the test dialogues with the same functions
    (test_reply,) = bot_replies.bot_turns([r for r in rows if r.split is Split.TEST])
    assert (test_reply.reply, test_reply.answered) == ("No thanks.", off)


def bad_fsb_family() -> LabelFamily:
    from dialogue_safety.sources import bad

    return bad.FAMILY


def _post(corpus: str, text: str, label: Label, split: Split, **meta: object) -> LabelledExample:
    return LabelledExample(
        utterance=text, label=label, source=corpus, split=split, family=LabelFamily.HATEFUL, metadata=meta
    )


def test_threat_posts_keep_the_corpus_labels_and_take_look_alikes_only_where_the_labels_judged_threats() -> None:
    off, safe, train = Label.OFFENSIVE, Label.SAFE, Split.TRAIN
    rows = [
        _post("ghc", "we should shoot them all", off, train, **{VIOLENCE: True}),
        *[_post("ghc", f"I shot a great photo number {i}", safe, train, **{VIOLENCE: False}) for i in range(5)],
        _post("ghc", "nice weather", safe, train, **{VIOLENCE: False}),  # no word of harm
        _post("ghc", "hang them at dawn", off, Split.TEST, **{VIOLENCE: True}),  # test: never
        _post("edos", "I will beat her", off, Split.VALID, **{VIOLENCE: True}),
        _post("edos", "women should die alone, sad", off, Split.VALID, **{VIOLENCE: False}),  # sexist, not a threat
        _post("edos", "kill the cops", safe, Split.VALID),  # not sexist: EDOS judged no threat
    ]
    built = list(threat_posts.build(rows, ALL))
    ghc = [ex for ex in built if ex.metadata["corpus"] == "ghc"]
    assert sum(ex.metadata[VIOLENCE] for ex in ghc) == 1 and len(ghc) == 1 + threat_posts.LOOK_ALIKES_PER_THREAT
    assert all(ex.metadata["harm_word"] in ("shoot", "shot") for ex in ghc)
    edos = [ex.utterance for ex in built if ex.metadata["corpus"] == "edos"]
    assert edos == ["I will beat her", "women should die alone, sad"]
    assert all(ex.source == "threat_posts" and ex.split is not Split.TEST for ex in built)
    assert {ex.task for ex in built} == {"threat_posts/ghc", "threat_posts/edos"}
    assert [ex.label for ex in built if ex.metadata[VIOLENCE]] == [off, off]  # the corpus labels, kept
    # the look-alikes are a stable function of the texts, not of the row order
    assert {ex.utterance for ex in threat_posts.build(rows[::-1], ALL)} == {ex.utterance for ex in built}


# --- on the real data ------------------------------------------------------------------------------


@pytest.mark.data
def test_convabuse_replies_on_the_real_data_follow_abuse_and_repeat_none_of_it(data_dir: Path) -> None:
    assert {i.name: i.usable for i in available_sources(data_dir)}[bot_replies.CONVABUSE]
    rows = load_source(bot_replies.CONVABUSE, data_dir)
    assert Counter(ex.split for ex in rows) == {Split.TRAIN: 57, Split.VALID: 18}
    assert len({ex.utterance for ex in rows}) == 15 and {ex.label for ex in rows} == {Label.SAFE}
    corpus = load_source("convabuse", data_dir, splits=["train", "valid"])
    labels: dict[str, set[Label]] = {}
    for ex in corpus:
        labels.setdefault(bot_replies.normalised(ex.utterance), set()).add(ex.label)
    abusive_texts = {t for t, ls in labels.items() if Label.OFFENSIVE in ls}
    for ex in rows:
        answered = ex.history[-1]
        assert answered.speaker == "user" and labels[bot_replies.normalised(answered.text)] == {Label.OFFENSIVE}
        assert not bot_replies.echoes(ex.utterance, answered.text)
        # the agent's reply is never itself a turn ConvAbuse rates abusive
        assert bot_replies.normalised(ex.utterance) not in abusive_texts
    assert "I don't have to put up with any abuse from you." in {ex.utterance for ex in rows}


@pytest.mark.data
def test_bad_replies_on_the_real_data_are_ok_bot_turns_after_not_ok_human_turns(data_dir: Path) -> None:
    rows = load_source(bot_replies.BAD, data_dir)
    assert Counter(ex.split for ex in rows) == {Split.TRAIN: 980, Split.VALID: 138}
    source = load_source("bad_fsb", data_dir, splits=["train", "valid"])
    ok_bot = {
        (ex.utterance, ex.history) for ex in source if ex.metadata["speaker"] == "bot" and not ex.label.is_positive
    }
    not_ok_bot = {
        bot_replies.normalised(ex.utterance)
        for ex in source
        if ex.metadata["speaker"] == "bot" and ex.label.is_positive
    }
    not_ok_human = {
        (ex.utterance, ex.history[-1].text if ex.history else "")
        for ex in source
        if ex.metadata["speaker"] == "human" and ex.label.is_positive
    }
    for ex in rows:
        assert (ex.utterance, ex.history) in ok_bot  # a bot turn BAD labels OK, in its own dialogue
        assert bot_replies.normalised(ex.utterance) not in not_ok_bot
        human = ex.history[-1]
        before = ex.history[-2].text if len(ex.history) > 1 else ""
        assert human.speaker == "human" and (human.text, before) in not_ok_human
    # no turn of bad_fsb's test dialogues (a canned "Hey do you want to talk about something else? How about we
    # talk about zebras?" recurs in many dialogues: the turn in its dialogue is what must not)
    test_turns = {(ex.utterance, ex.history) for ex in load_source("bad_fsb", data_dir, splits=["test"])}
    assert not test_turns & {(ex.utterance, ex.history) for ex in rows}


@pytest.mark.data
def test_threat_posts_on_the_real_data_are_every_labelled_threat_and_two_look_alikes_each(data_dir: Path) -> None:
    rows = load_source(threat_posts.SOURCE, data_dir)
    counts = Counter((ex.metadata["corpus"], ex.split, ex.metadata[VIOLENCE]) for ex in rows)
    assert counts[("ghc", Split.TRAIN, True)] + counts[("ghc", Split.VALID, True)] == 131  # every cv post of train
    assert counts[("edos", Split.TRAIN, True)] == 310 and counts[("edos", Split.VALID, True)] == 44  # category 1
    assert not any(ex.split is Split.TEST for ex in rows)
    for ex in rows:
        if not ex.metadata[VIOLENCE]:
            assert ex.metadata["harm_word"] in threat_posts.HARM_WORDS
            assert ex.metadata["corpus"] == "ghc" or ex.label is Label.OFFENSIVE  # EDOS: sexist posts only
    for corpus in ("ghc", "edos"):
        for split in (Split.TRAIN, Split.VALID):
            threats = counts[(corpus, split, True)]
            assert counts[(corpus, split, False)] <= threat_posts.LOOK_ALIKES_PER_THREAT * threats
    test_texts = {ex.utterance for name in ("ghc", "edos") for ex in load_source(name, data_dir, splits=["test"])}
    assert len(test_texts & {ex.utterance for ex in rows}) <= 2  # posts repeated across the corpus's own splits only
