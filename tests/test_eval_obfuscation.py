"""The obfuscation suite (dialogue_safety/evaluation/obfuscation.py) with keyword scorers: a scorer that
reads the raw words misses disguised ones, the same scorer behind the encoder's de-obfuscation does not."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dialogue_safety.core.obfuscation import deobfuscate
from dialogue_safety.core.schema import Example, Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.evaluation.obfuscation import KINDS, build_probes, disguise, evaluate_obfuscation, markdown
from tests.test_eval_support import KeywordScorer


def get(name: str, split: Split) -> list[LabelledExample]:
    if split is not Split.TEST:
        return []
    rows = [(f"you idiot {i}", Label.OFFENSIVE) for i in range(5)]
    rows += [(f"lovely day {i}", Label.SAFE) for i in range(5)]
    out = [LabelledExample(utterance=t, label=label, source=name, split=split) for t, label in rows]
    # a hate set's "not hateful" may be abuse at another target: never a harmless probe
    out.append(
        LabelledExample(
            utterance="my idiot teacher", label=Label.SAFE, source=name, split=split, family=LabelFamily.HATEFUL
        )
    )
    # a reply judged in its context is not judged on its words: never a probe
    out.append(
        LabelledExample(
            utterance="totally agree", history=(Turn("x"),), label=Label.OFFENSIVE, source=name, split=split
        )
    )
    return out


class DeobfuscatingScorer(KeywordScorer):
    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        return super().predict_proba([Example(utterance=deobfuscate(e.utterance)) for e in examples])


def test_every_kind_disguises_the_long_words_and_keeps_short_ones() -> None:
    rng = np.random.default_rng(0)
    for kind in KINDS:
        out = disguise("you are an idiot", kind, rng)
        assert out.startswith("you are an ") and "idiot" not in out, kind
        assert deobfuscate(out).endswith("idiot") or kind == "stretched", kind


def test_raw_keyword_scorer_misses_disguises_and_the_deobfuscating_one_does_not() -> None:
    probes = build_probes(get, seed=0, per_source=3)
    assert len(probes["offensive"]) == 15 and not any("agree" in t for t in probes["offensive"])
    assert len(probes["harmless"]) == 15 and "my idiot teacher" not in probes["harmless"]
    raw = evaluate_obfuscation(probes, {"model": KeywordScorer(["idiot"])})["scorers"]["model"]
    assert raw["recall_plain"] == 1.0 and raw["flagged_plain_harmless"] == 0.0
    assert raw["kinds"]["spaced"]["recall"] == 0.0 and raw["worst_gap_points"] == 100.0
    fixed = evaluate_obfuscation(probes, {"model": DeobfuscatingScorer(["idiot"])})["scorers"]["model"]
    gaps = {kind: row["gap_points"] for kind, row in fixed["kinds"].items()}
    # one swap at a word's end ("idio7") is left alone, as in "mp3": leetspeak may keep a gap
    assert all(gap == 0.0 for kind, gap in gaps.items() if kind not in ("stretched", "leetspeak")), gaps
    assert gaps["leetspeak"] < raw["kinds"]["leetspeak"]["gap_points"]
    assert all(row["flagged_harmless"] == 0.0 for row in fixed["kinds"].values())
    assert "| model | spaced | 100.0 % | +0.0 |" in markdown(
        {"n_offensive": 15, "n_harmless": 15, "scorers": {"model": fixed}}
    )
