"""The registry (hermetic, on the fixtures) and the real datasets' counts (marked ``data``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from conftest import require

from dialogue_safety.core.schema import Label, LabelFamily, Split
from dialogue_safety.sources import bad, bbf, wtc
from dialogue_safety.sources.errors import SourceUnavailableError
from dialogue_safety.sources.layout import Status
from dialogue_safety.sources.registry import (
    SOURCES,
    available_sources,
    describe_source,
    load_source,
    load_sources,
    source_names,
)

FIXTURES = Path(__file__).parent / "fixtures" / "sources"
FULL = FIXTURES / "full"
SAMPLES = FIXTURES / "samples"
NAMES = [
    "bbf_single_turn",
    "bbf_multi_turn",
    "wtc",
    "bad",
    "olid",
    "diasafety",
    "convabuse",
    "hatemoji",
    "dynahate",
    "context_pairs",
    "identity_mentions",
    "disguised",
    "collages",
    "requests",
    "threats",
    "breakit",
    "conan",
    "yu2022",
    "hickey2025",
    "hickey2024",
    "history_transplant",
    "bad_fsb",
    "toxicchat",
    "safetext",
    "medical_safety",
    "conda",
    "context_toxicity",
    "edos",
    "ghc",
    "convabuse_replies",
    "bad_replies",
    "threat_posts",
    "hatecheck",
]


def test_source_names_and_entries() -> None:
    assert source_names() == NAMES
    for source in SOURCES.values():
        assert source.licence and source.obtain and source.description
    assert SOURCES["diasafety"].family is LabelFamily.UNSAFE_IN_CONTEXT
    assert {n for n, s in SOURCES.items() if s.family is LabelFamily.HATEFUL} == {
        "hatemoji",
        "dynahate",
        "hatecheck",
        "edos",
        "ghc",
        "threat_posts",  # GHC and EDOS posts, their families kept
    }


def test_available_sources_on_complete_layouts() -> None:
    infos = available_sources(FULL)
    assert [i.name for i in infos] == NAMES
    assert {i.status for i in infos} == {Status.COMPLETE}
    assert all(i.usable and i.files for i in infos)


def test_available_sources_on_sample_layouts() -> None:
    statuses = {i.name: i.status for i in available_sources(SAMPLES)}
    assert statuses == {
        "bbf_single_turn": Status.SAMPLE,
        "bbf_multi_turn": Status.SAMPLE,
        "wtc": Status.SAMPLE,
        "bad": Status.SAMPLE,
        "dynahate": Status.PARTIAL,
        "identity_mentions": Status.COMPLETE,  # written in the repository: always there
        "requests": Status.COMPLETE,
        "threats": Status.COMPLETE,
        "disguised": Status.PARTIAL,  # derived: only the DynaHate sample of its inputs is there
    }
    everything = available_sources(SAMPLES, include_missing=True)
    assert len(everything) == len(NAMES) and describe_source("hatecheck", SAMPLES).status is Status.MISSING


def test_load_source_refuses_samples_unless_asked(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailableError, match="only samples are present"):
        load_source("wtc", SAMPLES)
    assert len(load_source("wtc", SAMPLES, allow_samples=True)) == 5
    with pytest.raises(SourceUnavailableError, match="no loadable files"):
        load_source("bad", SAMPLES, allow_samples=True)  # YAML fixtures are never loaded
    with pytest.raises(SourceUnavailableError, match="github.com/paul-rottger/hatecheck-data"):
        load_source("hatecheck", tmp_path)


def test_load_source_splits_and_errors() -> None:
    assert {ex.split for ex in load_source("diasafety", FULL, splits=["dev"])} == {Split.VALID}
    assert len(load_source("diasafety", FULL, splits=[Split.TRAIN, "test"])) == 5
    with pytest.raises(ValueError, match="unknown split 'holdout'"):
        load_source("diasafety", FULL, splits=["holdout"])
    with pytest.raises(ValueError, match="unknown source 'toxigen'"):
        load_source("toxigen", FULL)


def test_load_sources_and_env_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIALOGUE_SAFETY_DATA_DIR", str(FULL))
    loaded = load_sources(["hatecheck", "bad"])
    assert list(loaded) == ["hatecheck", "bad"]
    assert (len(loaded["hatecheck"]), len(loaded["bad"])) == (5, 15)


# --- the real data directory -----------------------------------------------------------------


def _counts(name: str, data_dir: Path) -> dict[tuple[Split, Label], int]:
    return dict(Counter((ex.split, ex.label) for ex in load_source(name, data_dir)))


@pytest.mark.data
def test_real_statuses(data_dir: Path) -> None:
    require(data_dir / "diasafety")
    statuses = {i.name: i.status.value for i in available_sources(data_dir)}
    assert statuses == {
        "bbf_single_turn": "sample-only",
        "bbf_multi_turn": "sample-only",
        "wtc": "sample-only",
        "bad": "sample-only",
        "bad_fsb": "complete",
        "toxicchat": "partial",
        "safetext": "complete",
        "medical_safety": "complete",
        "conda": "complete",
        "context_toxicity": "complete",
        "edos": "complete",
        "ghc": "complete",
        "olid": "complete",
        "diasafety": "complete",
        "convabuse": "complete",
        "hatemoji": "complete",
        "dynahate": "partial",
        "context_pairs": "complete",
        "identity_mentions": "complete",
        "disguised": "complete",
        "collages": "complete",
        "requests": "complete",
        "threats": "complete",
        "conan": "complete",
        "yu2022": "complete",
        "hickey2025": "complete",
        "hickey2024": "complete",
        "history_transplant": "complete",
        "convabuse_replies": "complete",
        "bad_replies": "complete",
        "threat_posts": "complete",
        "hatecheck": "complete",
    }


@pytest.mark.data
def test_real_counter_speech_counts(data_dir: Path) -> None:
    """The label mapping on the real files (dialogue_safety/sources/counter_speech.py), per split."""
    require(data_dir / "conan")
    kinds = Counter((ex.split, ex.metadata["kind"]) for ex in load_source("conan", data_dir))
    assert sum(v for (_, k), v in kinds.items() if k == "counter_narrative") == 5003 + 8311 - 1  # one empty CN turn
    yu = Counter((ex.split, ex.label) for ex in load_source("yu2022", data_dir))
    assert yu[(Split.TEST, Label.OFFENSIVE)] == 184 and yu[(Split.TEST, Label.SAFE)] == 361 + 168
    hickey = Counter(ex.metadata["kind"] for ex in load_source("hickey2025", data_dir))
    assert hickey["endorsement"] == 791 and hickey["hate"] == 37 + 39


@pytest.mark.data
def test_real_diasafety(data_dir: Path) -> None:
    require(data_dir / "diasafety" / "train.json.gz")
    assert _counts("diasafety", data_dir) == {
        (Split.TRAIN, Label.SAFE): 4839,
        (Split.TRAIN, Label.OFFENSIVE): 4178,
        (Split.VALID, Label.SAFE): 595,
        (Split.VALID, Label.OFFENSIVE): 502,
        (Split.TEST, Label.SAFE): 594,
        (Split.TEST, Label.OFFENSIVE): 501,
    }


@pytest.mark.data
def test_real_convabuse(data_dir: Path) -> None:
    require(data_dir / "convabuse" / "ConvAbuseEMNLPtrain.csv.gz")
    examples = load_source("convabuse", data_dir)
    counts = Counter((ex.split, ex.label) for ex in examples)
    assert [counts[(s, Label.OFFENSIVE)] + counts[(s, Label.SAFE)] for s in Split] == [2501, 831, 853]
    # majority of the annotators who labelled the row, repeat annotations by their own majority;
    # reading only literal "1" cells would give 331 / 108 / 123 (see dialogue_safety/sources/convabuse.py)
    assert [counts[(s, Label.OFFENSIVE)] for s in Split] == [337, 112, 127]
    # test example 1697 "shut up": three annotators chose abuse, two of them in repeat annotations
    (shut_up,) = (ex for ex in examples if ex.split is Split.TEST and ex.metadata["example_id"] == "1697")
    assert (shut_up.utterance, shut_up.label, shut_up.metadata["abusive_votes"]) == ("shut up", Label.OFFENSIVE, 3)
    assert Counter(ex.metadata["bot"] for ex in examples if ex.split is Split.TRAIN) == {
        "E.L.I.Z.A.": 1601,
        "CarbonBot": 900,
    }
    assert all(t.text.strip() and t.text != "nan" for ex in examples for t in ex.history)


@pytest.mark.data
def test_real_hatemoji(data_dir: Path) -> None:
    require(data_dir / "hatemoji" / "HatemojiBuild" / "train.csv")
    examples = load_source("hatemoji", data_dir)
    assert Counter(ex.split for ex in examples) == {Split.TRAIN: 4728, Split.VALID: 591, Split.TEST: 593}
    assert Counter(ex.round for ex in examples if ex.split is Split.TRAIN) == {"R5": 1595, "R6": 1572, "R7": 1561}
    assert sum(ex.label.is_positive for ex in examples if ex.split is Split.TRAIN) == 2387
    assert all(isinstance(ex.metadata["target"], tuple) for ex in examples)


@pytest.mark.data
def test_real_hatecheck(data_dir: Path) -> None:
    require(data_dir / "hatecheck" / "test_suite_cases.csv")
    examples = load_source("hatecheck", data_dir)
    assert len(examples) == 3728 and {ex.split for ex in examples} == {Split.TEST}
    assert len({ex.metadata["functionality"] for ex in examples}) == 29
    assert sum(ex.label.is_positive for ex in examples) == 2563


@pytest.mark.data
def test_real_dynahate_subset_grouped_split(data_dir: Path) -> None:
    require(data_dir / "dynahate-subset" / "db_dev.csv.gz")
    examples = load_source("dynahate", data_dir)
    splits = Counter(ex.split for ex in examples)
    assert splits[Split.TRAIN] + splits[Split.VALID] == 3506 and splits[Split.TEST] == 3571
    assert 0.12 < splits[Split.VALID] / 3506 < 0.18
    sides: dict[str, set[Split]] = {}
    for ex in examples:
        if ex.split is not Split.TEST:
            sides.setdefault(ex.metadata["group"], set()).add(ex.split)
    assert all(len(s) == 1 for s in sides.values())
    assert sum(1 for ex in examples if ex.split is not Split.TEST) - len(sides) == 116  # 116 linked pairs in dev
    assert Counter(ex.round for ex in examples if ex.split is Split.TEST)["3b"] == 583


@pytest.mark.data
def test_real_bbf_samples_parse_with_the_record_parser(data_dir: Path) -> None:
    folder = require(data_dir / "bbf-dialogue-safety")
    single = list(bbf.read_samples(folder / "sample_single_turn_safety_standard_train_r1_bad.jsonl"))
    multi = list(bbf.read_samples(folder / "sample_multi_turn_safety_train.jsonl"))
    assert len(single) == 8 and {ex.label for ex in single} == {Label.OFFENSIVE}
    assert Counter(ex.label for ex in multi) == {Label.OFFENSIVE: 3, Label.SAFE: 5}
    assert multi[0].utterance == "great answer you bellend." and len(multi[0].history) == 2


@pytest.mark.data
def test_real_wtc_sample(data_dir: Path) -> None:
    require(data_dir / "jigsaw-toxic-comments-sample" / "train_sample.csv")
    examples = load_source("wtc", data_dir, allow_samples=True)
    assert sum(ex.task != wtc.TEST_TASK for ex in examples) == 282
    kaggle = [ex for ex in examples if ex.task == wtc.TEST_TASK]
    assert len(kaggle) == 26 and sum(ex.label.is_positive for ex in kaggle) == 2


@pytest.mark.data
def test_bad_fixture_transcription_matches_parlai_yaml(data_dir: Path) -> None:
    """tests/fixtures BAD lines == the first examples of ParlAI's YAML regression fixtures."""
    yaml = pytest.importorskip("yaml")
    folder = require(data_dir / "bot-adversarial-dialogue-fixtures")
    found = bad.find(FULL)
    for name, split in bad.SPLIT_FILES.items():
        fixture = (
            folder / f"bot_adversarial_dialogue_bad_speaker_to_eval=all_bad_safety_mix=all_bad_num_turns=4_{name}.yml"
        )
        acts = [act[0] for act in yaml.safe_load(fixture.read_text(encoding="utf-8"))["acts"]]
        ours = list(bad.read_file(found.files[name], split))
        assert len(ours) == len(acts) == 5
        for ex, act in zip(ours, acts, strict=True):
            assert "\n".join([*(t.text for t in ex.history), ex.utterance]) == act["text"]
            assert ex.label is bbf.parlai_label((act.get("labels") or act["eval_labels"])[0])
            assert ex.metadata["speaker_to_eval"] == act["speaker_to_eval"]
            assert ex.metadata["bot_persona"] == act["bot_persona"]
