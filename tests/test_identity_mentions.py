"""The written identity_mentions source: every sentence SAFE, split by frame, and none of it taken
from an evaluation set (HateCheck's test cases, the context-flip suite, the shipped model's probes)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dialogue_safety.core.schema import Label, LabelFamily, Split
from dialogue_safety.evaluation.context_flips import load_pairs
from dialogue_safety.sources import identity_mentions
from dialogue_safety.sources.registry import load_source
from tests.conftest import require

PROBES = Path(__file__).with_name("test_model_probes.py")


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]+", "", text.lower()).strip()


def test_every_sentence_is_safe_and_split_by_frame(tmp_path: Path) -> None:
    rows = load_source("identity_mentions", tmp_path)  # written: needs no data directory
    assert len(rows) == len(identity_mentions.FRAMES) * len(identity_mentions.GROUPS)
    assert {r.label for r in rows} == {Label.SAFE} and {r.family for r in rows} == {LabelFamily.OFFENSIVE}
    split_of_frame: dict[str, set[Split]] = {}
    for r in rows:
        split_of_frame.setdefault(r.metadata["frame"], set()).add(r.split)
    assert all(len(s) == 1 for s in split_of_frame.values()), "a frame's sentences must share one split"
    assert {Split.TRAIN, Split.VALID} == set().union(*split_of_frame.values())
    assert any(r.history for r in rows) and any(not r.history for r in rows)
    assert all("{" not in r.utterance for r in rows)


def test_no_probe_or_flip_suite_text_is_written_here() -> None:
    written = {_norm(t) for _, t in identity_mentions.sentences()}
    constants = [n.value for n in ast.walk(ast.parse(PROBES.read_text())) if isinstance(n, ast.Constant)]
    probes = {_norm(c) for c in constants if isinstance(c, str) and len(c) < 80}
    flips = {_norm(t) for p in load_pairs() for t in (p.harmful_context, p.harmless_context, p.reply)}
    assert "i love my muslim neighbours" in probes  # the probe list was read
    assert not written & probes and not written & flips


@pytest.mark.data
def test_no_hatecheck_case_is_written_here(data_dir: Path) -> None:
    require(data_dir / "hatecheck")
    cases = {_norm(ex.utterance) for ex in load_source("hatecheck", data_dir)}
    assert len(cases) > 3000
    assert not {_norm(t) for _, t in identity_mentions.sentences()} & cases
