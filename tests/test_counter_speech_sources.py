"""Replies to hateful turns (conan, yu2022, hickey2025, hickey2024), the history transplant, and the
decomposed model: encoding rows, head targets, training rows, logits and the history measures."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import require

from dialogue_safety.core.encoding import DialogueEncoder, EncodedExample, EncodingConfig
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.schema import UTTERANCE_UNLABELLED, Example, Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.core.scoring import NO_CONTEXT_LOGIT, context_columns, decomposed_logits
from dialogue_safety.evaluation.history_robustness import (
    FRIENDLY_CHAT,
    build_probes,
    evaluate_history,
    friendly_history,
)
from dialogue_safety.sources import counter_speech, history_transplant
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.layout import Status
from dialogue_safety.training.harmonise import CONTEXT_HEAD, HEAD_ORDER, harmonised_targets, served_gold_from_targets
from dialogue_safety.training.heads import training_rows

FULL = Path(__file__).parent / "fixtures" / "sources" / "full"
ALL = frozenset(Split)


def _kinds(rows: list[LabelledExample]) -> Counter[tuple[str, str, str]]:
    return Counter((str(r.metadata["kind"]), r.label.value, r.family.value) for r in rows)


# --- loaders: the label mapping of each source ------------------------------------------------------


def test_conan_counter_narratives_are_safe_after_their_hate_and_the_hate_is_offensive() -> None:
    found = counter_speech.find_conan(FULL)
    assert found.status is Status.COMPLETE
    rows = list(counter_speech.load_conan(found, ALL))
    assert _kinds(rows) == {
        # 4 Multi-Target pairs + DIALOCONAN CN turns (one empty turn skipped)
        ("counter_narrative", "SAFE", "unsafe_in_context"): 4 + 3,
        # 3 distinct Multi-Target hate texts alone + 3 DIALOCONAN HS turns
        ("hate_speech", "OFFENSIVE", "hateful"): 3 + 3,
    }
    pair = next(r for r in rows if r.utterance.startswith("Judging millions"))
    assert pair.history == (Turn("Group X are all thieves."),)
    turn3 = next(r for r in rows if r.utterance.startswith("Belonging"))
    assert [t.text for t in turn3.history] == [
        "Group W ruin every neighbourhood they move into.",
        "Many neighbourhoods have been revived by newcomers opening shops.",
        "They still do not belong here.",
    ]
    # civil counter-narratives say something of the utterance too: SAFE alone
    assert not any(r.metadata.get(UTTERANCE_UNLABELLED) for r in rows)


def test_conan_splits_keep_each_hate_text_and_dialogue_in_one_split() -> None:
    rows = list(counter_speech.load_conan(counter_speech.find_conan(FULL), ALL))
    by_hate: dict[str, set[Split]] = {}
    for r in rows:
        if r.metadata["part"] == "multitarget":
            hate = r.history[0].text if r.history else r.utterance
            by_hate.setdefault(hate, set()).add(r.split)
    assert all(len(s) == 1 for s in by_hate.values())
    dialogues: dict[str, set[Split]] = {}
    for r in rows:
        if r.metadata["part"] == "dialoconan":
            dialogues.setdefault(str(r.metadata["dialogue_id"]), set()).add(r.split)
    assert all(len(s) == 1 for s in dialogues.values())
    # and it is a function of the key only: reading one split gives the same rows
    for split in Split:
        assert [r for r in rows if r.split is split] == list(
            counter_speech.load_conan(counter_speech.find_conan(FULL), frozenset({split}))
        )


def test_yu2022_hate_is_offensive_counter_and_neutral_safe_in_context_only() -> None:
    found = counter_speech.find_yu2022(FULL)
    assert found.status is Status.COMPLETE
    rows = list(counter_speech.load_yu2022(found, ALL))
    assert Counter((r.split, r.metadata["kind"], r.label) for r in rows) == {
        (Split.TRAIN, "counter", Label.SAFE): 1,
        (Split.TRAIN, "hate", Label.OFFENSIVE): 1,
        (Split.TRAIN, "neutral", Label.SAFE): 1,
        (Split.VALID, "counter", Label.SAFE): 1,
        (Split.TEST, "hate", Label.OFFENSIVE): 1,
    }
    rude = next(r for r in rows if r.utterance == "That sounds pretty dumb to me.")
    assert rude.family is LabelFamily.UNSAFE_IN_CONTEXT and rude.metadata[UTTERANCE_UNLABELLED]
    hate = next(r for r in rows if r.metadata["kind"] == "hate" and r.split is Split.TRAIN)
    assert hate.family is LabelFamily.OFFENSIVE and hate.history == (Turn("What do you think of the new policy?"),)


def test_yu2022_bad_label_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"label": "1", "context": "a", "target": "b"}\n{"label": "7", "context": "a", "target": "b"}\n')
    with pytest.raises(DatasetFormatError, match=r"train\.jsonl:2: unknown label '7'"):
        list(counter_speech.read_yu2022(bad, Split.TRAIN))


def test_hickey2025_agreeing_is_an_endorsement_and_the_rest_safe_in_context() -> None:
    found = counter_speech.find_hickey2025(FULL)
    assert found.status is Status.COMPLETE
    rows = list(counter_speech.load_hickey2025(found, ALL))
    kinds = {r.utterance: (r.metadata["kind"], r.label, r.family) for r in rows}
    assert kinds["So true. They really are."] == ("endorsement", Label.OFFENSIVE, LabelFamily.UNSAFE_IN_CONTEXT)
    # an insulting counter is still counter-speech upstream: SAFE in context, nothing said of the utterance
    assert kinds["Shut up you moron."] == ("counter", Label.SAFE, LabelFamily.UNSAFE_IN_CONTEXT)
    assert kinds["Anyway what is for dinner."][0] == "neutral"
    assert kinds["They are scum and should leave."] == ("hate", Label.OFFENSIVE, LabelFamily.OFFENSIVE)
    assert kinds["Hey that is not fair to them."][:2] == ("counter", Label.SAFE)
    assert len(rows) == 4 + 3  # the empty reply is skipped
    assert all(r.metadata.get(UTTERANCE_UNLABELLED) for r in rows if r.label is Label.SAFE)


def test_hickey2024_attacks_are_offensive_counterspeech_safe_in_context() -> None:
    rows = list(counter_speech.load_hickey2024(counter_speech.find_hickey2024(FULL), ALL))
    kinds = sorted((r.utterance, r.metadata["kind"], r.label.value) for r in rows)
    assert kinds == [
        ("Go away you clown.", "attack", "OFFENSIVE"),
        ("Please do not talk about people like that.", "counter", "SAFE"),
        ("That is a hateful thing to say.", "counter", "SAFE"),
    ]
    attack = next(r for r in rows if r.metadata["kind"] == "attack")
    assert [t.text for t in attack.history] == ["Group X are vermin.", "That is a hateful thing to say."]


def test_hickey2024_flag_that_is_not_0_or_1_names_the_line(tmp_path: Path) -> None:
    text = (FULL / "hostile-counterspeech-hickey2024" / "counterspeech_dataset.csv").read_text()
    (tmp_path / "counterspeech_dataset.csv").write_text(text.replace(",1,0,1,3,5", ",1,0,yes,3,5"))
    with pytest.raises(DatasetFormatError, match=r"counterspeech_dataset\.csv:2: reply_attack must be 0 or 1"):
        list(counter_speech.read_hickey2024(tmp_path / "counterspeech_dataset.csv", ALL))


# --- history transplant ----------------------------------------------------------------------------


def _olid(text: str, label: Label, split: Split = Split.TRAIN) -> LabelledExample:
    return LabelledExample(utterance=text, label=label, source="olid", split=split)


def test_transplant_pools_get_both_labels_and_keep_the_utterances_label() -> None:
    utterances = [_olid(f"insult number {i} you idiot", Label.OFFENSIVE) for i in range(300)]
    utterances += [_olid(f"a nice tweet number {i}", Label.SAFE) for i in range(300)]
    copies = list(history_transplant.transplant(utterances, ["Group X are vermin."], ["lovely day"]))
    assert 0.35 * 600 < len(copies) < 0.65 * 600
    by_pool = Counter((c.metadata["pool"], c.label) for c in copies)
    for pool in history_transplant.POOLS:
        pos, neg = by_pool[(pool, Label.OFFENSIVE)], by_pool[(pool, Label.SAFE)]
        assert pos > 30 and neg > 30
        assert 0.6 < pos / neg < 1.6  # the pool does not predict the label
    original = {u.utterance: u.label for u in utterances}
    assert all(c.label is original[c.utterance] and c.history for c in copies)
    friendly = [c for c in copies if c.metadata["pool"] == "friendly"]
    assert {len(c.history) for c in friendly} <= set(range(1, 7))
    assert all(c.history[-1].text == "Group X are vermin." for c in copies if c.metadata["pool"] == "hostile")


def test_transplant_friendly_turns_are_not_the_evaluations() -> None:
    assert not set(history_transplant.FRIENDLY_TURNS) & set(FRIENDLY_CHAT)


@pytest.mark.data
def test_transplant_from_the_data_directory_has_no_test_split(data_dir: Path) -> None:
    for name in ("olid", "convabuse", "conan"):
        require(data_dir / name)
    found = history_transplant.find(data_dir)
    assert found.status is Status.COMPLETE
    rows = list(history_transplant.load(found, ALL))
    assert rows and {r.split for r in rows} == {Split.TRAIN, Split.VALID}


# --- the decomposed model ------------------------------------------------------------------------


def test_decomposed_encoding_adds_the_utterance_alone_row(tiny_tokenizer) -> None:  # type: ignore[no-untyped-def]
    segments = DialogueEncoder(tiny_tokenizer, EncodingConfig(max_length=32, max_utterance_tokens=8))
    decomposed = DialogueEncoder(
        tiny_tokenizer, EncodingConfig(max_length=32, max_utterance_tokens=8, context_mode="decomposed")
    )
    long_reply = " ".join(["you"] * 20)
    examples = [Example.from_texts(long_reply, ["hello there"]), Example(utterance="hello")]
    plain, single = decomposed.encode_batch(examples)
    # the dialogue row is the segments encoding; the alone row is the utterance without history, uncut
    assert plain.input_ids == segments.encode(examples[0]).input_ids
    assert plain.alone is not None
    assert plain.alone.input_ids == segments.encode(Example(utterance=long_reply)).input_ids
    assert len(plain.alone) == 1 + 1 + 20 + 1
    assert single.alone is None and single.input_ids == segments.encode(examples[1]).input_ids
    assert plain.tokens == len(plain) + len(plain.alone)


def _row(*ids: int) -> EncodedExample:
    return EncodedExample(tuple(ids), (0,) * len(ids), (1,) * len(ids))


def test_decomposed_logits_read_each_head_from_its_row() -> None:
    alone = _row(1, 2)
    with_history = EncodedExample((1, 5, 2, 3), (0, 0, 0, 1), (1, 1, 1, 1), alone)
    without = _row(1, 9)
    seen: list[list[tuple[int, ...]]] = []

    def run(rows):  # type: ignore[no-untyped-def]
        seen.append([r.input_ids for r in rows])
        return np.array([[float(sum(r.input_ids)), -float(sum(r.input_ids)), 10.0 * len(r)] for r in rows])

    logits = decomposed_logits([with_history, without], run, [2])
    assert seen == [[(1, 5, 2, 3), (1, 9)], [(1, 2)]]
    # utterance heads (0, 1) from the alone row; the context head (2) from the dialogue row
    assert logits[0].tolist() == [3.0, -3.0, 40.0]
    # no history: utterance heads from the one row, no context harm
    assert logits[1].tolist() == [10.0, -10.0, NO_CONTEXT_LOGIT]
    assert np.array_equal(decomposed_logits([with_history], run, []), run([with_history]))


def test_context_columns_come_from_the_card() -> None:
    card = ModelCard(heads=list(HEAD_ORDER), context_heads=[CONTEXT_HEAD])
    assert context_columns(card) == []  # segments: every head reads the dialogue
    card.encoding = {**card.encoding, "context_mode": "decomposed"}
    assert context_columns(card) == [2]


def _ex(label: Label, family: LabelFamily, history: tuple[str, ...] = (), **meta: object) -> LabelledExample:
    return LabelledExample(
        utterance="u",
        history=tuple(Turn(t) for t in history),
        label=label,
        source="s",
        split=Split.TRAIN,
        family=family,
        metadata=meta,
    )


def test_decomposed_targets_keep_the_history_out_of_the_utterance_heads() -> None:
    heads = list(HEAD_ORDER[:3])  # the attribute heads are masked for every row here
    examples = [
        _ex(Label.OFFENSIVE, LabelFamily.OFFENSIVE, ("hi",)),  # an insult after a greeting
        _ex(Label.SAFE, LabelFamily.OFFENSIVE, ("Group X are vermin.",)),  # harmless reply after hate
        _ex(Label.OFFENSIVE, LabelFamily.UNSAFE_IN_CONTEXT, ("Should I hurt myself?",)),  # encouragement
        _ex(Label.SAFE, LabelFamily.UNSAFE_IN_CONTEXT, ("hate",), **{UTTERANCE_UNLABELLED: True}),  # rude counter?
        _ex(Label.SAFE, LabelFamily.UNSAFE_IN_CONTEXT, ("hate",)),  # civil counter-narrative
        _ex(Label.OFFENSIVE, LabelFamily.HATEFUL),  # hate alone
    ]
    y, mask = harmonised_targets(examples, heads, np.zeros(len(examples), dtype=bool), decomposed=True)
    nan = float("nan")
    got = np.where(mask > 0, y, nan)
    expected = np.array(
        [
            [1, nan, nan],
            [0, 0, 0],
            [nan, nan, 1],
            [nan, nan, 0],
            [0, 0, 0],
            [1, 1, nan],
        ]
    )
    np.testing.assert_array_equal(got, expected)
    gold, keep = served_gold_from_targets(y, mask, heads, decomposed=True)
    assert keep.tolist() == [True, True, True, False, True, True]
    assert gold[keep].tolist() == [1, 0, 1, 0, 1]
    # training rows: the dialogue row teaches only the context head, the alone row only the others
    alone = _row(1, 2)
    encoded = [EncodedExample((1, 3, 2), (0, 0, 1), (1, 1, 1), alone) for _ in examples[:5]] + [alone]
    rows, row_y, row_mask, origin = training_rows(encoded, y, mask, [2])
    assert origin.tolist() == [0, 1, 1, 2, 3, 4, 4, 5]
    assert [r.alone for r in rows] == [None] * len(rows)
    for r, m in zip(rows, row_mask, strict=True):
        if len(r) == 3:  # dialogue row
            assert m[:2].sum() == 0 and m[2] == 1
        else:
            assert m[2] == 0
    assert np.array_equal(row_y, y[origin])


# --- the history measures -------------------------------------------------------------------------


class _Scorer:
    """Flags an utterance containing 'idiot', and anything after a history containing 'vermin'."""

    name = "fake"
    threshold = 0.5

    def predict_proba(self, examples):  # type: ignore[no-untyped-def]
        return np.array(
            [1.0 if "idiot" in ex.utterance or any("vermin" in t.text for t in ex.history) else 0.0 for ex in examples]
        )


def test_history_measures_see_tainting_and_not_laundering() -> None:
    def ex(source: str, text: str, label: Label, split: Split = Split.TEST, **meta: object) -> LabelledExample:
        return LabelledExample(utterance=text, label=label, source=source, split=split, metadata=meta)

    rows = {
        "olid": [ex("olid", "you idiot", Label.OFFENSIVE), ex("olid", "nice day", Label.SAFE)],
        "convabuse": [ex("convabuse", "idiot bot", Label.OFFENSIVE), ex("convabuse", "hello bot", Label.SAFE)],
        "dynahate": [ex("dynahate", "Group X are vermin", Label.OFFENSIVE), ex("dynahate", "I like tea", Label.SAFE)],
        "conan": [
            ex("conan", "Group X are vermin", Label.OFFENSIVE, kind="hate_speech"),
            LabelledExample(
                utterance="People are people.",
                history=(Turn("Group X are vermin"),),
                label=Label.SAFE,
                source="conan",
                split=Split.TEST,
                metadata={"kind": "counter_narrative"},
            ),
        ],
        "hickey2025": [],
        "yu2022": [],
    }
    probes = build_probes(lambda name, split: [r for r in rows.get(name, []) if r.split is split])
    res = evaluate_history(probes, {"model": _Scorer()})["scorers"]["model"]
    assert res["benign_history"]["worst_drop"] == 0.0  # 'idiot' is caught whatever came before
    assert res["benign_history"]["pooled"]["alone"] == pytest.approx(100 * 2 / 3)  # 'vermin' alone is missed
    assert res["hostile_history"]["pooled"] == {"alone": 0.0, "after": 100.0}
    assert res["hostile_history"]["rise"] == 100.0
    assert res["counter_speech"]["civil_counter"] == {"n": 1, "flagged": 100.0}
    assert res["counter_speech"]["endorsements"] == {"n": 0, "caught": None}
    assert [t.text for t in friendly_history(3)] == list(FRIENDLY_CHAT[-3:])


class _Assent:
    """Flags a reply that says yes after a hateful turn, and nothing else."""

    name = "assent"
    threshold = 0.5

    def predict_proba(self, examples):  # type: ignore[no-untyped-def]
        return np.array([float(ex.utterance.startswith("yes") and bool(ex.history)) for ex in examples])


def test_the_hostile_rise_is_also_given_over_utterances_that_answer_nothing() -> None:
    def ex(source: str, text: str, label: Label, history: tuple[Turn, ...] = ()) -> LabelledExample:
        return LabelledExample(utterance=text, label=label, source=source, split=Split.TEST, history=history)

    rows = {
        "olid": [ex("olid", "yes the tea was lovely", Label.SAFE), ex("olid", "nice day", Label.SAFE)],
        "convabuse": [ex("convabuse", "yes of course", Label.SAFE, (Turn("shall I go on?", "bot"),))],
        "dynahate": [ex("dynahate", "Group X are vermin", Label.OFFENSIVE), ex("dynahate", "I like tea", Label.SAFE)],
        "conan": [],
        "hickey2025": [],
        "yu2022": [],
    }
    probes = build_probes(lambda name, split: [r for r in rows.get(name, []) if r.split is split])
    hostile = evaluate_history(probes, {"model": _Assent()})["scorers"]["model"]["hostile_history"]
    assert hostile["rise"] == pytest.approx(100 * 2 / 4)  # both yeses, of the four harmless utterances
    assert hostile["statements"] == {
        "n": 3,
        "alone": 0.0,
        "after": pytest.approx(100 / 3),
        "rise": pytest.approx(100 / 3),
    }
    assert hostile["sources"]["convabuse"] == {"n": 1, "alone": 0.0, "after": 100.0}
