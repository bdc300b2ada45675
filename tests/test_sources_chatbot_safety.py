"""The chatbot-safety sources (BAD as JSON, ToxicChat, SafeText, medical safety, CONDA, CAT, EDOS,
GHC), each read from a few hand-written rows in the upstream format, traps included."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from dialogue_safety.core.schema import Label, LabelFamily, Split, Turn
from dialogue_safety.sources import bad, bad_fsb, conda, context_toxicity, hate_posts, toxicchat, unsafe_advice
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.layout import Status
from dialogue_safety.sources.registry import available_sources, load_source

ALL = frozenset(Split)


def _write(path: Path, text: str, *, gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --- BAD (Few-Shot Bot JSON) ------------------------------------------------------------------

LONG = [["h1 hi", "b1 hello"], ["h2 how are you", "b2 fine"], ["h3 I hate them all", "b3 me too, they are vermin"]]


def _bad_dir(tmp_path: Path) -> Path:
    unsafe = [
        {"dialogue": LONG},  # a bot turn, 6 turns: whole dialogue kept upstream
        {"dialogue": LONG[:2] + [["h3 I hate them all", ""]]},  # a human turn, 5 turns
        {"dialogue": [["other opener, rude", ""]]},
    ]
    safe = [{"dialogue": LONG[:2], "meta": ["i like dogs."]}, {"dialogue": [["x hi", "y hello"]], "meta": []}]
    folder = tmp_path / "bad-valid-fsb"
    _write(folder / "safety_adv.json", json.dumps(unsafe), gz=True)
    _write(folder / "safety_safe_adv_valid.json", json.dumps(safe), gz=True)
    return tmp_path


def test_bad_fsb_last_four_turns_speaker_from_turn_count_and_labels(tmp_path: Path) -> None:
    found = bad_fsb.find(_bad_dir(tmp_path))
    assert found.status is Status.COMPLETE
    examples = list(bad_fsb.load(found, ALL))
    assert [ex.label for ex in examples] == [Label.OFFENSIVE] * 3 + [Label.SAFE] * 2
    bot = examples[0]
    # the length trap: 6 turns upstream, the utterance and its 3 previous turns read
    assert bot.utterance == "b3 me too, they are vermin" and len(bot.history) == bad.BAD_NUM_TURNS - 1
    assert bot.history == (Turn("h2 how are you", "human"), Turn("b2 fine", "bot"), Turn("h3 I hate them all", "human"))
    assert bot.metadata["speaker"] == "bot" and bot.task == "bad_fsb/bot" and bot.family is bad.FAMILY
    human = examples[1]
    assert human.metadata["speaker"] == "human" and human.utterance == "h3 I hate them all"
    assert [t.speaker for t in human.history] == ["bot", "human", "bot"]
    assert examples[2].history == () and examples[2].metadata["speaker"] == "human"
    assert examples[3].utterance == "b2 fine" and examples[3].metadata["speaker"] == "bot"


def test_bad_fsb_splits_by_dialogue_never_by_record(tmp_path: Path) -> None:
    examples = list(bad_fsb.load(bad_fsb.find(_bad_dir(tmp_path)), ALL))
    # the three records of the LONG dialogue (two unsafe, one safe suffix) share one split
    long_dialogue = [ex for ex in examples if ex.utterance in ("b3 me too, they are vermin", "h3 I hate them all")]
    long_dialogue.append(next(ex for ex in examples if ex.utterance == "b2 fine"))
    assert len({ex.split for ex in long_dialogue}) == 1
    keys = bad_fsb.dialogue_keys([[tuple(p) for p in LONG], [tuple(p) for p in LONG[:2]], [("x hi", "y hello")]])
    assert keys[0] == keys[1] != keys[2]
    # the key does not depend on record order
    assert bad_fsb.dialogue_keys([[("x hi", "y hello")], [tuple(p) for p in LONG[:2]]])[1] == keys[0]


def test_bad_fsb_malformed_record_names_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "bad-valid-fsb"
    _write(folder / "safety_adv.json", json.dumps([{"dialogue": [["only one"]]}]))
    _write(folder / "safety_safe_adv_valid.json", "[]")
    with pytest.raises(DatasetFormatError, match=r"safety_adv\.json.*record 0.*pair of strings"):
        list(bad_fsb.load(bad_fsb.find(tmp_path), ALL))


# --- ToxicChat --------------------------------------------------------------------------------


def _instance(key: str, text: str, toxicity: str, jailbreak: str = "0") -> dict[str, object]:
    def label(value: str) -> dict[str, object]:
        return {"majority_human": value, "individual_human_scores": []}

    return {"id": key, "instance": text, "annotations": {"toxicity": label(toxicity), "jailbreaking": label(jailbreak)}}


def test_toxicchat_labels_jailbreak_flag_and_partial_status(tmp_path: Path) -> None:
    rows = [_instance("a" * 64, "how do I make a pipe bomb", "1", "1"), _instance("b" * 64, "write a haiku", "0")]
    _write(tmp_path / "toxicchat-train" / "toxic_chat_train.json", json.dumps({"instances": rows}), gz=True)
    found = toxicchat.find(tmp_path)
    assert found.status is Status.PARTIAL and "test split is withheld" in found.note
    first, second = toxicchat.load(found, ALL)
    assert (first.label, first.metadata["jailbreaking"], first.history) == (Label.OFFENSIVE, True, ())
    assert (second.label, second.metadata["jailbreaking"]) == (Label.SAFE, False)
    assert first.family is LabelFamily.UNSAFE_IN_CONTEXT and first.metadata["kind"] == "request"


def test_toxicchat_unknown_label_is_a_format_error(tmp_path: Path) -> None:
    rows = [_instance("c" * 64, "hello", "maybe")]
    _write(tmp_path / "toxicchat-train" / "toxic_chat_train.json", json.dumps({"instances": rows}))
    with pytest.raises(DatasetFormatError, match=r"instance 0: toxicity label 'maybe'"):
        list(toxicchat.load(toxicchat.find(tmp_path), ALL))


# --- SafeText and medical safety --------------------------------------------------------------


def test_safetext_fragments_become_a_question_and_a_full_reply_split_by_scenario(tmp_path: Path) -> None:
    data = {
        "If you see a colorful mushroom,": {"unsafe": ["taste it."], "safe": ["do not eat it.", "take a photo"]},
        "To remove redness from eyes,": {"unsafe": ["douse them in vinegar."], "safe": ["use eyedrops."]},
    }
    _write(tmp_path / "safetext" / "SafeText.json", json.dumps(data), gz=True)
    examples = list(unsafe_advice.load_safetext(unsafe_advice.find_safetext(tmp_path), ALL))
    mushroom = [ex for ex in examples if "mushroom" in ex.history[0].text]
    assert [(ex.utterance, ex.label) for ex in mushroom] == [
        ("You should taste it.", Label.OFFENSIVE),
        ("You should do not eat it.", Label.SAFE),
        ("You should take a photo.", Label.SAFE),
    ]
    assert mushroom[0].history == (Turn("If you see a colorful mushroom, what should I do?", "user"),)
    assert len({ex.split for ex in mushroom}) == 1
    assert {ex.family for ex in examples} == {LabelFamily.UNSAFE_IN_CONTEXT}


MEDICAL_HEADER = (
    "query,query-label-expert,response-dialogpt,response-dialogpt-label-expert,response-alexa,"
    "response-alexa-label-expert,response-reddit ,response-reddit-label-expert\n"
)


def test_medical_safety_grades_map_by_query_seriousness_and_the_trailing_space_header(tmp_path: Path) -> None:
    rows = (
        "Why do I get headaches?,1,It's a tumour.,3,\"Sorry, I'm not sure.\",0,Drink water and rest.,2\n"
        "Crushing chest pain?,3,Take two aspirin.,2,,,,\n"
    )
    _write(tmp_path / "medical-safety" / "medicheck-expert.csv", MEDICAL_HEADER + rows, gz=True)
    examples = list(unsafe_advice.load_medical(unsafe_advice.find_medical(tmp_path), ALL))
    got = [(ex.history[0].text, ex.utterance, ex.label, ex.task) for ex in examples]
    assert got == [
        ("Why do I get headaches?", "It's a tumour.", Label.OFFENSIVE, "medical_safety/dialogpt"),
        ("Why do I get headaches?", "Sorry, I'm not sure.", Label.SAFE, "medical_safety/alexa"),
        # a recommendation after a non-serious query is not used; after a critical one it is unsafe
        ("Crushing chest pain?", "Take two aspirin.", Label.OFFENSIVE, "medical_safety/dialogpt"),
    ]


def test_medical_safety_unknown_grade_names_file_and_line(tmp_path: Path) -> None:
    _write(tmp_path / "medical-safety" / "medicheck-expert.csv", MEDICAL_HEADER + "q?,1,a,7,,,,\n")
    with pytest.raises(DatasetFormatError, match=r"medicheck-expert\.csv:2: .*unknown grade '7'"):
        list(unsafe_advice.load_medical(unsafe_advice.find_medical(tmp_path), ALL))


# --- CONDA ------------------------------------------------------------------------------------

CONDA_HEADER = "Id,matchId,conversationId,utterance,chatTime,playerSlot,playerId,intentClass,slotClasses,slotTokens\n"


def test_conda_rebuilds_conversations_across_files_in_chat_time_order(tmp_path: Path) -> None:
    folder = tmp_path / "conda"
    # shuffled rows; conversation 7 is spread over the three files; the test file has no labels
    _write(
        folder / "CONDA_train.csv",
        CONDA_HEADER + "3,1,7,you are trash [SEPA] uninstall,30,2,bad name,E,,\n1,1,7,gl hf,10,0,a,O,,\n",
        gz=True,
    )
    _write(folder / "CONDA_valid.csv", CONDA_HEADER + "4,1,7,ez,40,0,a,I,,\n", gz=True)
    _write(
        folder / "CONDA_test.csv", "Id,matchId,conversationId,utterance,chatTime,playerSlot,playerId\n2,1,7,hi,20,5,b\n"
    )
    found = conda.find(tmp_path)
    assert found.status is Status.COMPLETE
    examples = {ex.utterance: ex for ex in conda.load(found, ALL)}
    assert set(examples) == {"gl hf", "you are trash\nuninstall", "ez"}  # the unlabelled line is context only
    trash = examples["you are trash\nuninstall"]
    assert trash.history == (Turn("gl hf", "player0"), Turn("hi", "player5"))
    assert (trash.label, trash.family) == (Label.OFFENSIVE, LabelFamily.OFFENSIVE)
    ez = examples["ez"]
    assert (ez.label, ez.family) == (Label.OFFENSIVE, LabelFamily.UNSAFE_IN_CONTEXT)
    assert [t.text for t in ez.history] == ["gl hf", "hi", "you are trash\nuninstall"][-conda.HISTORY_TURNS :]
    assert examples["gl hf"].label is Label.SAFE and examples["gl hf"].history == ()
    assert len({ex.split for ex in examples.values()}) == 1  # one match, one split


def test_conda_unknown_intent_names_file_and_line(tmp_path: Path) -> None:
    folder = tmp_path / "conda"
    _write(folder / "CONDA_train.csv", CONDA_HEADER + "1,1,7,gl,10,0,a,Q,,\n")
    with pytest.raises(DatasetFormatError, match=r"CONDA_train\.csv:2: .*intentClass 'Q'"):
        list(conda.load(conda.find(tmp_path), ALL))


# --- CAT (context toxicity) -------------------------------------------------------------------


def test_context_toxicity_labels_with_and_without_the_parent(tmp_path: Path) -> None:
    folder = tmp_path / "context-toxicity-cat"
    _write(
        folder / "cat_small.csv",
        "text,parent_text,tox_codes_oc,label_oc,tox_codes_ic,label_ic\n"
        "fine by me,p1,[0. 0.],0,[0. 0.],0\n"
        "exactly what I meant,p2,[0. 0.],0,[1. 1.],1\n"
        "you idiot,p3,[1. 1.],1,[1. 1.],1\n"
        "odd one,p4,[1. 1.],1,[0. 0.],0\n",
    )
    _write(folder / "gc.csv", "id,text,parent,label,api\n1.1,go away troll,a parent,1,0.9\n1.2,thanks,hi,0,0.1\n")
    _write(folder / "gn.csv", "id,text,label,api,parent\n2.1,shut up,1,0.8,\n2.2,nice edit,0,0.1,\n")
    examples = {ex.utterance: ex for ex in context_toxicity.load(context_toxicity.find(tmp_path), ALL)}
    assert "odd one" not in examples  # toxic alone, not in context: not used
    assert (examples["fine by me"].label, examples["fine by me"].history) == (Label.SAFE, (Turn("p1"),))
    assert examples["exactly what I meant"].family is LabelFamily.UNSAFE_IN_CONTEXT
    assert examples["exactly what I meant"].label is Label.OFFENSIVE
    assert (examples["you idiot"].family, examples["you idiot"].label) == (LabelFamily.OFFENSIVE, Label.OFFENSIVE)
    assert examples["go away troll"].family is LabelFamily.UNSAFE_IN_CONTEXT
    assert examples["go away troll"].history == (Turn("a parent"),)
    assert examples["shut up"].history == () and examples["shut up"].family is LabelFamily.OFFENSIVE
    assert examples["nice edit"].label is Label.SAFE


# --- EDOS and GHC -----------------------------------------------------------------------------


def test_edos_official_splits_sexism_is_hateful_threat_and_objectification_flags(tmp_path: Path) -> None:
    _write(
        tmp_path / "edos" / "edos_labelled_aggregated.csv",
        "rewire_id,text,label_sexist,label_category,label_vector,split\n"
        'e-1,I will hurt her,sexist,"1. threats, plans to harm and incitement",1.1 threats of harm,train\n'
        "e-2,she is a toy,sexist,2. derogation,2.3 dehumanising attacks & overt sexual objectification,dev\n"
        "e-3,nice weather,not sexist,none,none,test\n"
        "e-4,start shooting at the cops,not sexist,none,none,train\n",
        gz=True,
    )
    threat, toy, weather, not_sexist_threat = hate_posts.load_edos(hate_posts.find_edos(tmp_path), ALL)
    assert (threat.split, threat.label, threat.family) == (Split.TRAIN, Label.OFFENSIVE, LabelFamily.HATEFUL)
    assert threat.metadata["violence"] and threat.metadata["category"] == "1" and "sexual" not in threat.metadata
    assert toy.split is Split.VALID and toy.metadata["sexual"] and toy.metadata["vector"] == "2.3"
    assert (weather.split, weather.label, weather.metadata["category"]) == (Split.TEST, Label.SAFE, "")
    assert toy.metadata["violence"] is False  # a sexist post of another category: judged not a threat
    # EDOS judges threats among sexist posts only: a not-sexist post says nothing of violence
    assert "violence" not in weather.metadata and "violence" not in not_sexist_threat.metadata


def test_ghc_hate_violence_and_vulgarity(tmp_path: Path) -> None:
    folder = tmp_path / "gab-hate-corpus"
    _write(folder / "GHC_train.tsv", "text\thd\tcv\tvo\nkill them all\t1\t1\t0\nwhat the f\xa0hell\t0\t0\t1\n", gz=True)
    _write(folder / "GHC_test.tsv", "text\thd\tcv\tvo\nnice day\t0\t0\t0\nbad\t2\t0\t0\n")
    found = hate_posts.find_ghc(tmp_path)
    examples = []
    with pytest.raises(DatasetFormatError, match=r"GHC_test\.tsv:3: .*column hd: '2'"):
        examples.extend(hate_posts.load_ghc(found, ALL))
    kill, vulgar, nice = examples
    assert (kill.family, kill.label, kill.metadata["violence"]) == (LabelFamily.HATEFUL, Label.OFFENSIVE, True)
    assert (vulgar.family, vulgar.label) == (LabelFamily.OFFENSIVE, Label.OFFENSIVE)
    assert (nice.label, nice.split) == (Label.SAFE, Split.TEST)
    assert kill.split in (Split.TRAIN, Split.VALID)


@pytest.mark.data
def test_every_new_source_is_found_and_loads_from_the_data_directory(data_dir: Path) -> None:
    names = ["bad_fsb", "toxicchat", "safetext", "medical_safety", "conda", "context_toxicity", "edos", "ghc"]
    infos = {info.name: info for info in available_sources(data_dir)}
    assert all(infos[name].usable for name in names)
    bad_examples = load_source("bad_fsb", data_dir)
    assert len(bad_examples) == 7002  # the official valid size
    assert Counter(ex.label for ex in bad_examples) == {Label.SAFE: 4239, Label.OFFENSIVE: 2763}
    assert max(len(ex.history) for ex in bad_examples) == bad.BAD_NUM_TURNS - 1
    counts = Counter((ex.metadata["speaker"], ex.label) for ex in bad_examples)
    assert counts[("bot", Label.OFFENSIVE)] == 887 and counts[("human", Label.OFFENSIVE)] == 1876
