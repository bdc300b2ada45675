"""Malformed files raise DatasetFormatError naming the file, the line or record, and the problem."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from dialogue_safety.core.schema import Split
from dialogue_safety.sources import bad, bbf, convabuse, diasafety, dynahate, functional, hatemoji, wtc
from dialogue_safety.sources.errors import DatasetFormatError

HATEMOJI_HEADER = "entry_id,text,type,target,round.base,round.set,set,split,label_gold,matched_text,matched_id\n"
WTC_HEADER = "id,comment_text,toxic,severe_toxic,obscene,threat,insult,identity_hate\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(call: Callable[[], Iterable[object]]) -> str:
    """The message of the DatasetFormatError raised while reading everything ``call`` returns."""
    with pytest.raises(DatasetFormatError) as info:
        list(call())
    return str(info.value)


def test_it_is_a_value_error_with_structured_fields() -> None:
    err = DatasetFormatError("data/x.csv", "broken", line=3)
    assert isinstance(err, ValueError)
    assert (str(err.path), err.line, err.problem, str(err)) == ("data/x.csv", 3, "broken", "data/x.csv:3: broken")
    assert str(DatasetFormatError("a.json", "bad", where="train[2]")) == "a.json at train[2]: bad"


# --- CSV -------------------------------------------------------------------------------------


def test_unknown_label_names_file_line_column_and_expected_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "train.csv",
        HATEMOJI_HEADER + "0,fine text,none,['none'],5,5a,original,train,0,x,1\n"
        "1,other text,none,['none'],5,5a,original,train,maybe,x,0\n",
    )
    message = error_of(lambda: hatemoji.read_file(path, Split.TRAIN))
    assert message == f"{path}:3: unknown label 'maybe' in column label_gold (expected 0 or 1)"


def test_missing_column_is_reported_on_the_header_line(tmp_path: Path) -> None:
    path = write(tmp_path, "train.csv", "entry_id,text,type\n0,hello,none\n")
    message = error_of(lambda: hatemoji.read_file(path, Split.TRAIN))
    assert message.startswith(f"{path}:1: missing column 'target', 'round.base', 'set', 'split', 'label_gold'")


def test_empty_required_text(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "cases.csv",
        "functionality,case_id,test_case,label_gold,target_ident,direction\nf_h,1,  ,hateful,women,general\n",
    )
    assert error_of(lambda: functional.read_suite(path)) == f"{path}:2: empty text in column test_case"


def test_csv_line_numbers_count_physical_lines_of_multiline_records(tmp_path: Path) -> None:
    path = write(tmp_path, "train.csv", WTC_HEADER + 'a1,"line one\nline two",0,0,0,0,0,0\na2,text,0,0,2,0,0,0\n')
    assert error_of(lambda: wtc.read_train(path)) == f"{path}:4: unknown label '2' in column obscene (expected 0 or 1)"


def test_wrong_number_of_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "train.csv", WTC_HEADER + "a1,text,0,0,0\n")
    assert error_of(lambda: wtc.read_train(path)) == f"{path}:2: expected 8 fields as in the header, found 5"


def test_wtc_test_labels_partly_unscored(tmp_path: Path) -> None:
    path = write(tmp_path, "test_with_labels.csv", WTC_HEADER + "a1,text,-1,-1,0,-1,-1,-1\n")
    assert error_of(lambda: wtc.read_test(path)) == f"{path}:2: some label columns are -1 (unscored) and others are not"


def test_wtc_test_id_without_labels(tmp_path: Path) -> None:
    test = write(tmp_path, "test.csv", "id,comment_text\nzz,hello\n")
    labels = write(tmp_path, "test_labels.csv", "id,toxic,severe_toxic,obscene,threat,insult,identity_hate\n")
    assert error_of(lambda: wtc.read_test(test, labels)) == f"{test}:2: id 'zz' has no row in {labels}"


def test_hatemoji_target_must_be_a_python_list(tmp_path: Path) -> None:
    path = write(tmp_path, "test.csv", HATEMOJI_HEADER + "0,text,none,none,5,5a,original,test,0,x,1\n")
    message = error_of(lambda: hatemoji.read_file(path, Split.TEST))
    assert message == f"{path}:2: column target must be a Python list of strings, found 'none'"


def test_hatemoji_split_column_must_match_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "validation.csv", HATEMOJI_HEADER + "0,text,none,['none'],5,5a,original,train,0,x,1\n")
    message = error_of(lambda: hatemoji.read_file(path, Split.VALID))
    assert message == f"{path}:2: split 'train' in column split disagrees with the file (valid)"


def test_dynahate_unknown_label_and_wrong_split(tmp_path: Path) -> None:
    header = "acl.id,text,label,type,target,level,split,round,acl.id.matched\n"
    path = write(tmp_path, "db_dev.csv", header + "acl1,text,hateful,none,none,original,dev,1,\n")
    assert error_of(lambda: dynahate.read_subset_dev(path)) == (
        f"{path}:2: unknown label 'hateful' in column label (expected hate or nothate)"
    )
    path = write(tmp_path, "db_dev.csv", header + "acl1,text,hate,none,none,original,test,1,\n")
    assert (
        error_of(lambda: dynahate.read_subset_dev(path)) == f"{path}:2: expected split dev in a dev file, found 'test'"
    )


CONVABUSE_HEADER = "prev_agent,prev_user,agent,user,bot,conv_id," + ",".join(
    f"Annotator{a}_is_abuse.{v}" for a in (1, 2) for v in (1, 0, -1, -2, -3)
)


@pytest.mark.parametrize(
    ("votes", "problem"),
    [
        (
            "1,0,yes,0,0,,,,,",
            "unknown value 'yes' in column Annotator1_is_abuse.-1 (expected 0, 1 or, for repeat annotations, "
            "a comma-separated list of them)",
        ),
        (",,,,,,,,,", "no annotator labelled this row (all AnnotatorN_is_abuse.* cells are empty)"),
        ("1,1,0,0,0,,,,,", "Annotator1 annotation 1: expected one is_abuse column set to 1, found 2"),
        ('1,0,0,0,0,"1, 0",0,0,0,0', "Annotator2_is_abuse.* columns disagree on the number of annotations"),
    ],
)
def test_convabuse_annotation_errors(tmp_path: Path, votes: str, problem: str) -> None:
    path = write(
        tmp_path, "ConvAbuseEMNLPvalid.csv", f"{CONVABUSE_HEADER}\n,,,fine,bot,1,1,0,0,0,0,,,,,\n,,,hi,bot,2,{votes}\n"
    )
    assert error_of(lambda: convabuse.read_file(path, Split.VALID)) == f"{path}:3: {problem}"


def test_convabuse_needs_all_five_is_abuse_columns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "ConvAbuseEMNLPvalid.csv",
        "prev_agent,prev_user,agent,user,bot,conv_id,Annotator1_is_abuse.1\n,,,hi,b,1,1\n",
    )
    assert error_of(lambda: convabuse.read_file(path, Split.VALID)) == (
        f"{path}:1: missing column Annotator1_is_abuse.0, Annotator1_is_abuse.-1, Annotator1_is_abuse.-2, "
        "Annotator1_is_abuse.-3"
    )


# --- JSON ------------------------------------------------------------------------------------


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "val.json", '[\n{"context": "a",\n "response": }\n]')
    assert (
        error_of(lambda: diasafety.read_file(path, Split.VALID))
        == f"{path}:3: invalid JSON: Expecting value (column 14)"
    )


def test_diasafety_unknown_label_names_the_record(tmp_path: Path) -> None:
    records = [
        {"context": "c", "response": "r", "category": "x", "label": "Safe"},
        {"context": "c", "response": "r", "category": "x", "label": "unsafe"},
    ]
    path = write(tmp_path, "train.json", json.dumps(records))
    assert error_of(lambda: diasafety.read_file(path, Split.TRAIN)) == (
        f"{path} at [1]: unknown label 'unsafe' in field label (expected Safe or Unsafe)"
    )
    path = write(
        tmp_path, "train.json", json.dumps([{"context": " ", "response": "r", "category": "x", "label": "Safe"}])
    )
    assert error_of(lambda: diasafety.read_file(path, Split.TRAIN)) == f"{path} at [0]: empty text in field 'context'"


def _single_turn(records: dict[str, list[dict[str, object]]], split: str = "train") -> str:
    return json.dumps({"standard": {split: {"1": records}}})


def test_bbf_label_must_agree_with_its_bucket(tmp_path: Path) -> None:
    record = {"text": "hello", "labels": ["__notok__"], "episode_done": True}
    path = write(tmp_path, "single_turn_safety.json", _single_turn({"good": [record]}))
    assert error_of(lambda: bbf.read_single_turn(path)) == (
        f"{path} at standard.train.1.good[0]: label '__notok__' disagrees with bucket 'good'"
    )


def test_bbf_record_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "single_turn_safety.json", _single_turn({"bad": [{"text": "x", "labels": ["maybe"]}]}))
    assert error_of(lambda: bbf.read_single_turn(path)) == (
        f"{path} at standard.train.1.bad[0]: unknown label 'maybe' in 'labels' (expected __ok__ or __notok__)"
    )
    path = write(tmp_path, "single_turn_safety.json", _single_turn({"bad": [{"text": "", "labels": ["__notok__"]}]}))
    assert error_of(lambda: bbf.read_single_turn(path)) == f"{path} at standard.train.1.bad[0]: empty or missing 'text'"
    path = write(tmp_path, "single_turn_safety.json", _single_turn({"good": []}, split="holdout"))
    assert error_of(lambda: bbf.read_single_turn(path)) == (
        f"{path} at standard.holdout: unknown split 'holdout' "
        "(expected one of train, valid, validation, val, dev, test)"
    )
    path = write(tmp_path, "multi_turn_safety.json", json.dumps({"test": [{"text": "hi\n ", "labels": ["__ok__"]}]}))
    assert (
        error_of(lambda: bbf.read_multi_turn(path)) == f"{path} at test[0]: empty utterance (the last line of 'text')"
    )


def test_bbf_sample_lines_report_their_line(tmp_path: Path) -> None:
    good = {
        "source_file": "multi_turn_safety.json",
        "json_path": ["train", 0],
        "record": {"text": "a", "labels": ["__ok__"]},
    }
    bad_line = {
        "source_file": "multi_turn_safety.json",
        "json_path": ["train", 1],
        "record": {"text": "b", "labels": []},
    }
    path = write(tmp_path, "sample.jsonl", f"{json.dumps(good)}\n{json.dumps(bad_line)}\n{{oops\n")
    assert error_of(lambda: bbf.read_samples(path)) == (
        f"{path}:2: missing 'labels' (expected ['__ok__'] or ['__notok__'])"
    )
    path = write(tmp_path, "sample.jsonl", f"{json.dumps(good)}\n{{oops\n")
    assert error_of(lambda: bbf.read_samples(path)).startswith(f"{path}:2: invalid JSON: ")


# --- ParlAI text -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (
            "text:hi\tlabels:__maybe__\tspeaker_to_eval:human",
            "unknown label '__maybe__' in field labels (expected __ok__ or __notok__)",
        ),
        ("text:hi\tlabels:__ok__", "unknown speaker_to_eval '' (expected human or bot)"),
        ("labels:__ok__\tspeaker_to_eval:bot", "missing field 'text'"),
        ("text:hi\tspeaker_to_eval:bot", "missing field 'labels' (or 'eval_labels')"),
        ("text:hi\tjunk\tlabels:__ok__", "field 'junk' is not key:value"),
    ],
)
def test_bad_line_errors(tmp_path: Path, line: str, problem: str) -> None:
    path = write(tmp_path, "train.txt", f"text:fine\tlabels:__ok__\tspeaker_to_eval:human\n{line}\n")
    assert error_of(lambda: bad.read_file(path, Split.TRAIN)) == f"{path}:2: {problem}"


# --- one policy for missing and malformed sources -----------------------------------------------


def test_one_policy_for_missing_and_malformed_sources(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import shutil

    from dialogue_safety.sources.errors import SourceUnavailableError
    from dialogue_safety.sources.registry import load_present_sources

    full = Path(__file__).parent / "fixtures" / "sources" / "full"
    shutil.copytree(full / "diasafety", tmp_path / "diasafety")
    # a missing optional source: skipped with a warning
    with caplog.at_level(logging.WARNING, logger="dialogue_safety.sources"):
        present = load_present_sources(["diasafety", "convabuse"], tmp_path, splits=["test"])
    assert list(present.examples) == ["diasafety"] and present.examples["diasafety"]
    assert {ex.split for ex in present.examples["diasafety"]} == {Split.TEST}
    assert list(present.skipped) == ["convabuse"] and "skipping source convabuse" in caplog.text
    # a missing required source: an error naming where it was looked for
    with pytest.raises(SourceUnavailableError, match=str(tmp_path)):
        load_present_sources(["diasafety", "convabuse"], tmp_path, required=["convabuse"])
    # a malformed file: always raised, never skipped (optional or not)
    (tmp_path / "diasafety" / "test.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="test.json"):
        load_present_sources(["diasafety", "convabuse"], tmp_path, splits=["test"])
