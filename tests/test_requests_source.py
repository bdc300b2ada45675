"""The written requests source: harmful requests OFFENSIVE and their look-alikes SAFE, every complying
reply seen with both labels, split by key word, and nothing taken from an evaluation set."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from written_sources import flip_texts, norm, probe_texts

from dialogue_safety.core.schema import Label, LabelFamily, Split
from dialogue_safety.sources import request_pairs
from dialogue_safety.sources.registry import load_source


def test_requests_and_look_alikes_share_their_word_and_split(tmp_path: Path) -> None:
    rows = load_source("requests", tmp_path)  # written: needs no data directory
    assert {r.family for r in rows} == {LabelFamily.UNSAFE_IN_CONTEXT}
    alone = [r for r in rows if r.metadata["kind"] == "request"]
    assert all(not r.history for r in alone)
    for word, (harmful, safe) in request_pairs.PAIRS.items():
        assert len(harmful) >= 2 and len(safe) >= 2
        mine = [r for r in alone if r.metadata["word"] == word]
        assert {r.utterance for r in mine if r.label is Label.OFFENSIVE} == set(harmful)
        assert {r.utterance for r in mine if r.label is Label.SAFE} == set(safe)
    splits_of_word: dict[str, set[Split]] = defaultdict(set)
    for r in rows:
        splits_of_word[r.metadata["word"]].add(r.split)
    assert all(len(s) == 1 for s in splits_of_word.values()), "a word's examples must share one split"
    assert set().union(*splits_of_word.values()) == set(Split)


def test_every_complying_reply_has_both_labels_and_a_refusal_is_safe(tmp_path: Path) -> None:
    rows = load_source("requests", tmp_path, splits=["train"])
    labels: dict[str, set[Label]] = defaultdict(set)
    for r in rows:
        if r.metadata["kind"] == "comply":
            labels[r.utterance].add(r.label)
    assert set(labels) == set(request_pairs.COMPLYING_REPLIES)
    assert all(v == {Label.SAFE, Label.OFFENSIVE} for v in labels.values())
    refusals = [r for r in rows if r.metadata["kind"] == "refuse"]
    assert refusals and {r.label for r in refusals} == {Label.SAFE}
    assert all(r.history[0].text in request_pairs.PAIRS[r.metadata["word"]][0] for r in refusals)


def test_no_probe_or_flip_suite_text_is_written_here() -> None:
    written = {norm(t) for harmful, safe in request_pairs.PAIRS.values() for t in (*harmful, *safe)}
    written |= {norm(t) for t in (*request_pairs.COMPLYING_REPLIES, *request_pairs.REFUSING_REPLIES)}
    probes, flips = probe_texts(), flip_texts()
    assert probes and flips
    assert not written & probes and not written & flips
