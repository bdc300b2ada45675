"""The written threats source: threats OFFENSIVE with the violence attribute, look-alikes sharing their verb
SAFE, split by verb, and nothing taken from a probe or an evaluation suite."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path

from written_sources import flip_texts, norm, probe_texts

from dialogue_safety.core.schema import VIOLENCE, Label, LabelFamily, Split
from dialogue_safety.sources import threat_sentences
from dialogue_safety.sources.registry import load_source

#: the verbs of the probes' threats: never written here, so the probes measure verbs the source does not teach
PROBE_VERBS = ("kill", "die", "dies", "hurt", "slit", "death", "murder")


def test_threats_are_offensive_and_violent_and_look_alikes_safe_split_by_verb(tmp_path: Path) -> None:
    rows = load_source("threats", tmp_path)  # written: needs no data directory
    assert rows and {r.family for r in rows} == {LabelFamily.OFFENSIVE} and not any(r.history for r in rows)
    for verb, (threats, look_alikes) in threat_sentences.pairs().items():
        assert len(threats) >= 3 and len(look_alikes) >= 3
        mine = [r for r in rows if r.metadata["verb"] == verb]
        assert {r.utterance for r in mine if r.label is Label.OFFENSIVE} == set(threats)
        assert {r.utterance for r in mine if r.label is Label.SAFE} == set(look_alikes)
    assert all(r.metadata[VIOLENCE] is r.label.is_positive for r in rows)
    splits_of_verb: dict[str, set[Split]] = defaultdict(set)
    for r in rows:
        splits_of_verb[r.metadata["verb"]].add(r.split)
    assert all(len(s) == 1 for s in splits_of_verb.values()), "a verb's sentences must share one split"
    assert set().union(*splits_of_verb.values()) == set(Split)
    assert load_source("threats", tmp_path, splits=["train"]) and {
        r.split for r in load_source("threats", tmp_path, splits=["valid"])
    } == {Split.VALID}


def test_no_probe_text_or_probe_verb_and_no_flip_suite_text_is_written_here() -> None:
    written = {norm(t) for threats, safe in threat_sentences.pairs().values() for t in (*threats, *safe)}
    probes, flips = probe_texts(), flip_texts()
    assert probes and flips
    assert not written & probes and not written & flips
    words = {w for text in written for w in text.split()}
    assert not words & set(PROBE_VERBS), words & set(PROBE_VERBS)


#: sha256 of the rows (text, label, split, family, metadata) the threats source gave when its sentences were Python
#: literals in threat_sentences.py (commit 693f9d3): the data file must give exactly the same rows, in the same order
LITERAL_ROWS = (137, "4d1e8d1df3e17a64b88eba295d46ca332882e67e46359532268bec119072f24c")


def test_the_data_file_gives_exactly_the_rows_of_the_literals_it_replaced() -> None:
    rows = list(threat_sentences.examples(frozenset(Split)))
    blob = json.dumps(
        [[r.utterance, r.label.value, r.split.value, r.family.value, dict(r.metadata)] for r in rows],
        ensure_ascii=False,
    )
    assert (len(rows), hashlib.sha256(blob.encode()).hexdigest()) == LITERAL_ROWS
    assert threat_sentences.find(Path("/nowhere")).files["sentences"].name == "threats.tsv"
