"""Each dataset format, read from the hand-written fixtures in tests/fixtures/sources/."""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from pathlib import Path

import pytest

from dialogue_safety.core.schema import Label, LabelFamily, Split, Turn
from dialogue_safety.sources import bad, bbf, convabuse, diasafety, dynahate, functional, hatemoji, wtc
from dialogue_safety.sources.layout import Status
from dialogue_safety.sources.splitting import parse_split, stable_fraction, three_way_split

FIXTURES = Path(__file__).parent / "fixtures" / "sources"
FULL = FIXTURES / "full"
SAMPLES = FIXTURES / "samples"
ALL = frozenset(Split)


# --- splitting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("train", Split.TRAIN),
        ("dev", Split.VALID),
        ("val", Split.VALID),
        ("Validation", Split.VALID),
        ("test", Split.TEST),
    ],
)
def test_split_aliases(name: str, split: Split) -> None:
    assert parse_split(name) is split


def test_stable_fraction_is_a_fixed_function_of_key_and_salt() -> None:
    # golden value: sha256("wtc:0000997932d777bf"), first 8 bytes / 2**64 — must never change
    assert stable_fraction("0000997932d777bf", "wtc") == pytest.approx(0.2850790733, abs=1e-9)
    assert stable_fraction("x", "a") != stable_fraction("x", "b")


def test_three_way_split_proportions() -> None:
    counts = Counter(three_way_split(f"id{i}", "salt") for i in range(20_000))
    assert counts[Split.TRAIN] / 20_000 == pytest.approx(0.8, abs=0.01)
    assert counts[Split.VALID] / 20_000 == pytest.approx(0.1, abs=0.01)


# --- BBF -------------------------------------------------------------------------------------


def test_bbf_single_turn_keeps_tasks_splits_rounds_and_labels() -> None:
    examples = list(bbf.read_single_turn(FULL / "dialogue_safety" / "single_turn_safety.json"))
    assert len(examples) == 13
    keys = Counter((ex.task, ex.split, ex.round, ex.label) for ex in examples)
    assert keys[("bbf_single_turn/standard", Split.TRAIN, "1", Label.SAFE)] == 2
    assert keys[("bbf_single_turn/standard", Split.TRAIN, "2", Label.OFFENSIVE)] == 1
    assert keys[("bbf_single_turn/adversarial", Split.VALID, "2", Label.SAFE)] == 1
    assert keys[("bbf_single_turn/adversarial", Split.TEST, "1", Label.OFFENSIVE)] == 1
    first = examples[0]
    assert first.utterance == "i love walking my dog in the park"
    assert first.history == ()
    assert (first.source, first.family) == ("bbf_single_turn", LabelFamily.OFFENSIVE)


def test_bbf_multi_turn_last_line_is_the_utterance() -> None:
    examples = list(bbf.read_multi_turn(FULL / "dialogue_safety" / "multi_turn_safety.json"))
    assert Counter(ex.split for ex in examples) == {Split.TRAIN: 3, Split.VALID: 1, Split.TEST: 1}
    first = examples[0]
    assert first.utterance == "stop talking, you bore me"
    assert first.history == (Turn("hi how are you?"), Turn("good thanks, and you?"))
    assert first.label is Label.OFFENSIVE and first.source == "bbf_multi_turn" and first.round is None
    assert examples[2].history == () and examples[2].utterance == "what do you do for fun?"


def test_bbf_finds_parlai_layout_and_prefers_full_files_over_samples(tmp_path: Path) -> None:
    assert bbf.find_single_turn(FULL).status is Status.COMPLETE
    assert bbf.find_multi_turn(SAMPLES).status is Status.SAMPLE
    shutil.copytree(SAMPLES / "bbf-dialogue-safety", tmp_path / "bbf-dialogue-safety")
    shutil.copy(FULL / "dialogue_safety" / "single_turn_safety.json", tmp_path / "bbf-dialogue-safety")
    found = bbf.find_single_turn(tmp_path)
    assert found.status is Status.COMPLETE and found.files["data"].name == "single_turn_safety.json"
    assert bbf.find_single_turn(tmp_path / "nowhere").status is Status.MISSING


def test_bbf_samples_go_through_the_same_record_parser() -> None:
    folder = SAMPLES / "bbf-dialogue-safety"
    single = list(bbf.read_samples(folder / "sample_single_turn_safety_standard_train_r1_bad.jsonl"))
    assert [(ex.task, ex.split, ex.round, ex.label) for ex in single] == [
        ("bbf_single_turn/standard", Split.TRAIN, "1", Label.OFFENSIVE)
    ] * 2
    multi = list(bbf.read_samples(folder / "sample_multi_turn_safety_train.jsonl"))
    full = list(bbf.read_multi_turn(FULL / "dialogue_safety" / "multi_turn_safety.json"))
    assert multi[0].utterance == full[0].utterance and multi[0].history == full[0].history
    assert multi[1].metadata["index"] == 4


# --- Wikipedia Toxic Comments ----------------------------------------------------------------


def test_wtc_train_any_label_is_offensive_and_split_by_id_hash() -> None:
    examples = list(wtc.read_train(FULL / "jigsaw-toxic-comment-classification-challenge" / "train.csv"))
    assert len(examples) == 10
    offensive = {ex.metadata["id"] for ex in examples if ex.label is Label.OFFENSIVE}
    assert offensive == {"a000000000000002", "a000000000000004", "a000000000000006", "a000000000000009"}
    assert all(ex.split is wtc.split_of(ex.metadata["id"]) for ex in examples)
    assert examples[1].metadata["categories"] == ("toxic", "insult")
    assert examples[2].utterance.startswith("== Sources ==\n")  # a quoted multi-line comment


def test_wtc_kaggle_test_joins_labels_and_skips_unscored_rows() -> None:
    folder = FULL / "jigsaw-toxic-comment-classification-challenge"
    examples = list(wtc.read_test(folder / "test.csv", folder / "test_labels.csv"))
    assert [ex.metadata["id"] for ex in examples] == ["b000000000000001", "b000000000000002", "b000000000000004"]
    assert [ex.label for ex in examples] == [Label.OFFENSIVE, Label.SAFE, Label.SAFE]
    assert {(ex.task, ex.split) for ex in examples} == {("wtc/kaggle_test", Split.TEST)}


def test_wtc_sample_layout_is_sample_only_and_reads_the_joined_test_file() -> None:
    found = wtc.find(SAMPLES)
    assert found.status is Status.SAMPLE
    examples = list(wtc.load(found, ALL))
    kaggle = [ex for ex in examples if ex.task == "wtc/kaggle_test"]
    assert len(examples) == 5 and len(kaggle) == 2
    assert wtc.find(FULL).status is Status.COMPLETE


# --- Bot-Adversarial Dialogue ----------------------------------------------------------------


def test_bad_parlai_text_format_history_and_alternating_speakers() -> None:
    found = bad.find(FULL)
    assert found.status is Status.COMPLETE
    examples = list(bad.load(found, ALL))
    assert Counter(ex.split for ex in examples) == {Split.TRAIN: 5, Split.VALID: 5, Split.TEST: 5}
    train = [ex for ex in examples if ex.split is Split.TRAIN]
    # the first five examples of ParlAI's bot_adversarial_dialogue train fixture
    assert [ex.label for ex in train] == [Label.SAFE, Label.OFFENSIVE, Label.SAFE, Label.SAFE, Label.SAFE]
    assert train[0].history == () and train[0].utterance == "Hi, Nice to meet you!"
    second = train[1]
    assert second.utterance.startswith("You too! I'm sorry to hear about your dad.")
    assert second.history == (Turn("Hi, Nice to meet you!", "human"),)
    assert second.metadata["speaker_to_eval"] == "bot"
    assert second.metadata["bot_persona"].split("\n")[1] == "your persona: my dad died when i was in high school."
    fifth = train[4]
    assert [t.speaker for t in fifth.history] == ["bot", "human", "bot"]
    assert (fifth.source, fifth.family, fifth.round) == ("bad", LabelFamily.UNSAFE_IN_CONTEXT, None)


def test_bad_flat_layout_eval_labels_and_escapes(tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "test.txt").write_text(
        "text:hi\\nwho are you?\\nnone of your business__PIPE__loser\teval_labels:__notok__|__ok__\t"
        "speaker_to_eval:human\tepisode_done:True\n\n",
        encoding="utf-8",
    )
    found = bad.find(tmp_path)
    assert found.status is Status.PARTIAL and "train" in found.note
    (ex,) = bad.load(found, ALL)
    assert ex.utterance == "none of your business|loser" and ex.label is Label.OFFENSIVE
    assert ex.history == (Turn("hi", "human"), Turn("who are you?", "bot"))


def test_bad_yaml_fixtures_alone_are_sample_only_and_not_loaded() -> None:
    found = bad.find(SAMPLES)
    assert found.status is Status.SAMPLE and found.files == {}


# --- DiaSafety -------------------------------------------------------------------------------


def test_diasafety_context_is_a_user_turn(tmp_path: Path) -> None:
    found = diasafety.find(FULL)
    examples = list(diasafety.load(found, ALL))
    assert Counter(ex.split for ex in examples) == {Split.TRAIN: 4, Split.VALID: 2, Split.TEST: 1}
    first = examples[0]
    assert first.history == (Turn("I think people who disagree with me are all idiots.", "user"),)
    assert first.utterance == "Yeah, they really are idiots."
    assert first.label is Label.OFFENSIVE and first.family is LabelFamily.UNSAFE_IN_CONTEXT
    assert first.metadata["category"] == "Toxicity Agreement"
    assert examples[3].utterance == ""  # upstream has empty responses; they are kept


def test_diasafety_reads_gzip(tmp_path: Path) -> None:
    folder = tmp_path / "diasafety"
    folder.mkdir()
    with gzip.open(folder / "val.json.gz", "wb") as out:
        out.write((FULL / "diasafety" / "val.json").read_bytes())
    found = diasafety.find(tmp_path)
    assert found.status is Status.PARTIAL and found.note == "missing train, test"
    assert [ex.split for ex in diasafety.load(found, ALL)] == [Split.VALID, Split.VALID]


# --- ConvAbuse -------------------------------------------------------------------------------


def test_convabuse_majority_rule_history_and_metadata() -> None:
    found = convabuse.find(FULL)
    examples = {ex.metadata["example_id"]: ex for ex in convabuse.load(found, ALL)}
    assert len(examples) == 6  # example 13 (train): a reply after abuse, for convabuse_replies
    first = examples["10"]
    assert first.label is Label.OFFENSIVE and first.utterance == "women belong in the kitchen"
    assert first.history == (
        Turn("Hello, how can I help?", "agent"),
        Turn("tell me a joke", "user"),
        Turn("Why?", "agent"),
    )
    assert dict(first.metadata) == {
        "bot": "CarbonBot",
        "conv_id": "500",
        "example_id": "10",
        "annotators": 3,
        "abusive_votes": 2,
        "types": ("sexist",),  # Annotator3's misnamed "Annotator2_sexist" column counts for Annotator3
        "target": "system",
    }
    assert examples["12"].label is Label.SAFE and examples["12"].metadata["types"] == ()
    assert examples["20"].label is Label.SAFE  # 1 of 2: not more than half


def test_convabuse_repeat_annotations_count_once_by_their_own_majority() -> None:
    (ex,) = (
        e
        for e in convabuse.read_file(FULL / "convabuse" / "ConvAbuseEMNLPtrain.csv", Split.TRAIN)
        if e.utterance == "shut up"
    )
    assert ex.label is Label.OFFENSIVE
    assert (ex.metadata["annotators"], ex.metadata["abusive_votes"], ex.metadata["target"]) == (2, 2, "individual")
    assert ex.history == (Turn("Please go on.", "agent"),)  # empty and "nan" cells are left out


# --- HatemojiBuild ---------------------------------------------------------------------------


def test_hatemoji_rounds_targets_and_official_splits() -> None:
    examples = list(hatemoji.load(hatemoji.find(FULL), ALL))
    assert [(ex.split, ex.round, ex.label) for ex in examples] == [
        (Split.TRAIN, "R5", Label.OFFENSIVE),
        (Split.TRAIN, "R5", Label.SAFE),
        (Split.TRAIN, "R6", Label.OFFENSIVE),
        (Split.TRAIN, "R6", Label.SAFE),
        (Split.VALID, "R7", Label.SAFE),
        (Split.TEST, "R7", Label.OFFENSIVE),
    ]
    first = examples[0]
    assert first.utterance == "I would love to 🔪 all of them 🐀" and first.family is LabelFamily.HATEFUL
    assert first.metadata == {
        "entry_id": "0",
        "matched_id": "1",
        "set": "original",
        "type": "threateninglanguage",
        "target": ("mus", "arab"),
        "round_set": "5a",
    }


# --- DynaHate --------------------------------------------------------------------------------


def test_dynahate_full_file_official_splits() -> None:
    found = dynahate.find(FULL)
    assert found.status is Status.COMPLETE
    examples = list(dynahate.load(found, ALL))
    assert [(ex.split, ex.round, ex.label) for ex in examples] == [
        (Split.TRAIN, "2a", Label.OFFENSIVE),
        (Split.TRAIN, "2b", Label.SAFE),
        (Split.TRAIN, "1", Label.SAFE),
        (Split.VALID, "3a", Label.OFFENSIVE),
        (Split.VALID, "3b", Label.SAFE),
        (Split.TEST, "1", Label.OFFENSIVE),
    ]
    assert examples[0].metadata["variant"] == "full" and examples[0].metadata["matched_id"] == "acl2"
    assert examples[2].metadata["matched_id"] is None  # R's NA


def test_dynahate_picks_the_highest_full_version(tmp_path: Path) -> None:
    folder = tmp_path / "dynahate"
    folder.mkdir()
    source = FULL / "dynahate" / "Dynamically Generated Hate Dataset v0.2.3.csv"
    for version in ("v0.2.2", "v0.2.10"):
        shutil.copy(source, folder / f"Dynamically Generated Hate Dataset {version}.csv")
    assert dynahate.find(tmp_path).files["full"].name.endswith("v0.2.10.csv")


def test_dynahate_subset_dev_is_split_by_group() -> None:
    found = dynahate.find(SAMPLES)
    assert found.status is Status.PARTIAL
    examples = list(dynahate.load(found, ALL))
    dev = [ex for ex in examples if ex.split is not Split.TEST]
    assert len(dev) == 6 and sum(ex.split is Split.TEST for ex in examples) == 2
    groups = {ex.metadata["acl_id"]: ex.metadata["group"] for ex in dev}
    assert groups["acl10"] == groups["acl11"] == "acl10"
    assert groups["acl14"] == groups["acl15"] == "acl14"
    assert groups["acl13"] == "acl13"  # its partner acl99 was filtered out of the subset
    for ex in dev:
        assert ex.split is dynahate.subset_split(ex.metadata["group"])
    assert {ex.metadata["variant"] for ex in examples} == {"subset"}


def test_dynahate_group_ids_join_chains_and_absent_partners() -> None:
    groups = dynahate.group_ids([("b", "c"), ("c", "a"), ("d", ""), ("e", "z")])
    assert groups == {"a": "a", "b": "a", "c": "a", "d": "d", "e": "e", "z": "e"}


# --- functional suites -----------------------------------------------------------------------


def test_hatecheck_suite() -> None:
    examples = list(functional.load_hatecheck(functional.find_hatecheck(FULL), ALL))
    assert len(examples) == 5 and {ex.split for ex in examples} == {Split.TEST}
    assert [ex.label for ex in examples].count(Label.OFFENSIVE) == 3
    profanity = examples[3]
    assert profanity.metadata == {
        "functionality": "profanity_nh",
        "target": None,
        "set": None,
        "case_id": "900",
        "direction": "-",
    }
    assert (profanity.source, profanity.family) == ("hatecheck", LabelFamily.HATEFUL)


def test_hatemojicheck_preset() -> None:
    examples = list(functional.read_suite(FIXTURES / "functional" / "HatemojiCheck.csv", functional.HATEMOJICHECK))
    assert [ex.label for ex in examples] == [Label.OFFENSIVE, Label.SAFE, Label.OFFENSIVE]
    assert examples[1].metadata == {
        "functionality": "verb_swap",
        "target": "women",
        "set": "polarity_perturb",
        "case_id": "1",
        "direction": None,
    }
    assert examples[0].source == "hatemojicheck"


def test_custom_column_mapping(tmp_path: Path) -> None:
    path = tmp_path / "suite.csv"
    path.write_text("sentence,gold,func\nyou people are vermin,H,dehum\nnice weather,N,neutral\n", encoding="utf-8")
    mapping = functional.ColumnMapping(
        suite="mysuite",
        text="sentence",
        label="gold",
        functionality="func",
        positive=frozenset({"H"}),
        negative=frozenset({"N"}),
    )
    assert [ex.label for ex in functional.read_suite(path, mapping)] == [Label.OFFENSIVE, Label.SAFE]
