"""The long_messages suite (dialogue_safety/evaluation/long_messages.py) with a keyword scorer: the
texts are built as documented and the numbers are what the scorer says."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
from test_eval_support import KeywordScorer

from dialogue_safety.core.encoding import EncodedExample
from dialogue_safety.core.schema import Example, Label, LabelledExample, Split
from dialogue_safety.evaluation.long_messages import (
    POSITIONS,
    build_probes,
    compare_window_rules,
    embed,
    evaluate_long_messages,
    filler,
    markdown,
    window_rules_markdown,
    window_scores,
)


def _rows(name: str) -> list[LabelledExample]:
    bad = [f"{name} insult {i}: you idiot" for i in range(6)]
    good = [f"{name} harmless remark number {i} about the garden" for i in range(40)] + [f"{name} noisy rant"]
    return [
        LabelledExample(utterance=t, label=label, source=name, split=Split.TEST)
        for texts, label in ((bad, Label.OFFENSIVE), (good, Label.SAFE))
        for t in texts
    ]


def get(name: str, split: Split) -> list[LabelledExample]:
    return _rows(name) if split is Split.TEST else []


def test_filler_and_embedding() -> None:
    rng = np.random.default_rng(0)
    parts = filler([f"part {i}" for i in range(100)], 200, rng)
    assert 180 <= len(" ".join(parts)) <= 200 and len(set(parts)) == len(parts)
    for position in POSITIONS:
        text = embed("INSULT", parts, position, rng)
        assert text.count("INSULT") == 1 and len(text) == len(" ".join(parts)) + len(" INSULT")
    assert embed("INSULT", parts, "start", rng).startswith("INSULT ")
    assert embed("INSULT", parts, "end", rng).endswith(" INSULT")


def test_recall_and_flag_rates_follow_the_scorer() -> None:
    probes = build_probes(get, seed=0, per_source=4, sources=("olid", "convabuse"))
    assert len(probes["offensive"]) == 8 and all("idiot" in ex.utterance for ex in probes["offensive"])
    # "rant" parts are flagged alone: the quiet texts leave them out, the gold texts may hold them
    scorer = KeywordScorer(["idiot", "rant"])
    result = evaluate_long_messages(probes, {"model": scorer}, total_chars=600)
    row = result["scorers"]["model"]
    assert result["quiet_utterances"] == result["harmless_utterances"] - 2
    assert row["recall_alone"] == 1.0 and all(row[f"recall_{p}"] == 1.0 for p in POSITIONS)
    assert row["worst_drop_points"] == 0.0 and row["quiet_long_flagged"] == 0.0
    assert row["gold_long_flagged"] == row["gold_any_part_flagged"]  # a keyword scorer reads every word
    assert row["n_filler_safe"] == 8 and row["recall_middle_filler_safe"] == 1.0
    assert "| model | 100.0% |" in markdown(result)


class FirstCharsScorer(KeywordScorer):
    """Reads only the first 60 characters, as a model that never reads past its first window."""

    def predict_proba(self, examples: Sequence[Example]) -> np.ndarray:
        return super().predict_proba([Example(utterance=e.utterance[:60]) for e in examples])


def test_a_scorer_that_reads_the_start_only_misses_the_end() -> None:
    probes = build_probes(get, seed=0, per_source=4, sources=("olid",))
    row = evaluate_long_messages(probes, {"model": FirstCharsScorer(["idiot"])}, total_chars=600)["scorers"]["model"]
    assert row["recall_alone"] == 1.0 and row["recall_start"] == 1.0
    assert row["recall_end"] == 0.0 and row["worst_drop_points"] == 100.0


class WordWindowClassifier:
    """A fake runtime that reads a text in windows of 8 words, each window 1.0 if it holds a keyword."""

    card = type("Card", (), {"threshold": 0.5})()

    def __init__(self, keywords: Sequence[str]) -> None:
        self.keywords = keywords

    def _score(self, text: str) -> float:
        return float(any(k in text for k in self.keywords))

    def encode(self, examples: Sequence[Example]) -> list[EncodedExample]:
        out = []
        for e in examples:
            words = e.utterance.split()
            rows = [
                EncodedExample(tuple(ord(c) for c in " ".join(words[i : i + 8])), ())
                for i in range(0, max(len(words), 1), 8)
            ]
            out.append(replace(rows[0], more=tuple(rows[1:])))
        return out

    def predict_encoded(self, rows: Sequence[EncodedExample]) -> list[SimpleNamespace]:
        return [SimpleNamespace(score=self._score("".join(map(chr, r.input_ids)))) for r in rows]

    def predict(self, examples: Sequence[Example]) -> list[SimpleNamespace]:
        return [SimpleNamespace(score=self._score(e.utterance)) for e in examples]


def test_window_rules_tried_are_measured_per_window() -> None:
    clf = WordWindowClassifier(["idiot", "rant"])
    scores = window_scores(clf, ["a b c d e f g h i j idiot", "short"])
    assert [len(s) for s in scores] == [2, 1] and scores[0].tolist() == [0.0, 1.0]

    def valid(name: str, split: Split) -> list[LabelledExample]:
        return [replace(ex, split=Split.VALID) for ex in _rows(name)] if split is Split.VALID else []

    result = compare_window_rules(clf, valid, Split.VALID, per_source=4, total_chars=600)
    assert result["split"] == "valid" and result["n_offensive"] == 8 and result["recall_alone"] == 1.0
    rules = result["rules"]
    assert all(r["quiet_flagged"] == 0.0 for r in rules.values())  # no "rant" in a quiet text
    assert rules["max (in force)"]["worst_drop_points"] == 0.0 and rules["max (in force)"]["f1"] == 1.0
    # one window holds the insult: the second-highest window never does
    assert rules["second-highest window"]["recall"] == dict.fromkeys(POSITIONS, 0.0)
    assert rules["mean of the top 2 windows"]["worst_drop_points"] == 0.0  # (1 + 0) / 2 >= 0.5
    assert "| max (in force) | 0.0% | 100.0% |" in window_rules_markdown(result)
