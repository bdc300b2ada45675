"""AAA on a toy dataset: attack outputs checked string by string, the χ² rule, the geometric mean."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2
from test_eval_support import FIXTURE_DATA, KeywordScorer, ex

from dialogue_safety.core.schema import Turn
from dialogue_safety.evaluation.aaa import (
    AAAResources,
    aaa_scores,
    build_attacks,
    correlated_words,
    evaluate_aaa,
    geometric_mean,
    hashtagify,
    rate_drop,
)

RESOURCES = AAAResources(
    templates=('"<tweet>" can you believe this', '@user actually said "<tweet>"'), hurtlex=frozenset({"idiot"})
)
TEST = [
    ex("you idiot", True, history=["hi"]),
    ex("nice day", False),
    ex("go away loser", True),
    ex("thanks", False),
    ex("see you", False),
]
WORDS = (["sunny", "lovely", "tea"], ["loser", "dumb"])  # (non-abusive words, abusive words)


def texts(examples: list) -> list[tuple[str, str]]:
    return [(e.utterance, e.label.value) for e in examples]


def test_attack_outputs_for_seed_0() -> None:
    sets = build_attacks([], TEST, RESOURCES, seed=0, words=WORDS)
    assert texts(sets["quo_a_to_n"]) == [
        ('@user actually said "you idiot"', "SAFE"),
        ('@user actually said "go away loser"', "SAFE"),
    ]
    # abusive posts shuffled once ([you idiot, go away loser]) and used in turn
    assert texts(sets["flip_n_to_a"]) == [
        ("you idiot nice day", "OFFENSIVE"),
        ("go away loser thanks", "OFFENSIVE"),
        ("you idiot see you", "OFFENSIVE"),
    ]
    assert texts(sets["corr_a_to_a"]) == [
        ("you idiot #sunny #sunny #lovely #sunny #lovely", "OFFENSIVE"),
        ("go away loser #sunny #lovely #sunny #sunny #sunny", "OFFENSIVE"),
    ]
    assert texts(sets["corr_n_to_n"]) == [
        ("nice day #dumb #dumb #dumb", "SAFE"),
        ("thanks #loser #dumb #loser #dumb", "SAFE"),
        ("see you #dumb #dumb", "SAFE"),
    ]
    assert texts(sets["hashtag"]) == [
        ("#you #idiot", "OFFENSIVE"),
        ("#nice #day", "SAFE"),
        ("#go #away #loser", "OFFENSIVE"),
        ("#thanks", "SAFE"),
        ("#see #you", "SAFE"),
    ]
    # the utterance is attacked, the dialogue history is kept
    assert sets["quo_a_to_n"][0].history == (Turn("hi"),)
    assert sets["corr_a_to_a"][0].history == (Turn("hi"),)
    assert sets["hashtag"][0].history == (Turn("hi"),)
    assert sets["quo_a_to_n"][0].metadata["aaa_attack"] == "quo_a_to_n"


def test_attacks_are_deterministic_given_the_seed() -> None:
    a = build_attacks([], TEST, RESOURCES, seed=3, words=WORDS)
    b = build_attacks([], TEST, RESOURCES, seed=3, words=WORDS)
    c = build_attacks([], TEST, RESOURCES, seed=4, words=WORDS)
    for name in ("quo_a_to_n", "flip_n_to_a", "corr_a_to_a", "corr_n_to_n"):
        assert texts(a[name]) == texts(b[name])
    assert any(texts(a[n]) != texts(c[n]) for n in ("quo_a_to_n", "corr_a_to_a", "corr_n_to_n"))


def test_hashtagify() -> None:
    assert hashtagify("@user you are #dumb") == "#you #are #dumb"
    assert hashtagify("  two   spaces ") == "#two #spaces"


def test_correlated_words_skip_hurtlex_words_and_lemmas() -> None:
    train = [ex(t, True) for t in ["you idiot", "idiots everywhere", "stupid idiot", "stupid people", "you are stupid"]]
    train += [ex(t, False) for t in ["sunny day", "lovely sunny morning", "what a lovely day", "have a sunny day"]]
    non_abusive, abusive = correlated_words(train, frozenset({"idiot"}))
    assert non_abusive[:3] == ["lovely", "day", "sunny"] or set(non_abusive[:3]) == {"lovely", "day", "sunny"}
    assert abusive[0] == "stupid"
    assert "idiot" not in abusive and "idiots" not in abusive  # "idiots" through its lemma
    assert not set(abusive) & set(non_abusive)
    # top-k first, then the HurtLex filter (as upstream): top-2 abusive = stupid, idiot → [stupid]
    assert correlated_words(train, frozenset({"idiot"}), top_k=2)[1] == ["stupid"]


def test_rate_drop_chi_squared() -> None:
    # TPR 50/50 → 20/50. Yates: expected 35, 15, 35, 15; (|O−E| − ½)² = 14.5² in every cell
    drop = rate_drop(50, 50, 20, 50)
    statistic = 14.5**2 * (2 / 35 + 2 / 15)
    assert drop["p_value"] == pytest.approx(chi2.sf(statistic, 1))
    assert drop["significant_drop"] is True
    assert rate_drop(40, 50, 38, 50)["significant_drop"] is False  # a small drop: p ≈ 0.8
    assert rate_drop(20, 50, 50, 50)["significant_drop"] is False  # a significant *rise* is no drop
    assert rate_drop(50, 50, 50, 50) == {"before": 1.0, "after": 1.0, "p_value": 1.0, "significant_drop": False}
    assert rate_drop(0, 0, 0, 0)["p_value"] is None


def _rule_case(hashtag_correct_pos: int, hashtag_correct_neg: int) -> dict:
    gold = np.array([1] * 50 + [0] * 50)
    original = gold.copy()  # every original prediction right
    hashtag = np.array(
        [1] * hashtag_correct_pos
        + [0] * (50 - hashtag_correct_pos)
        + [0] * hashtag_correct_neg
        + [1] * (50 - hashtag_correct_neg)
    )
    attacks = {
        "quo_a_to_n": np.zeros(10, dtype=int),  # all right (gold non-abusive)
        "flip_n_to_a": np.ones(10, dtype=int),  # all right (gold abusive)
        "corr_a_to_a": np.array([1] * 8 + [0] * 2),  # 0.8
        "corr_n_to_n": np.zeros(10, dtype=int),  # all right
    }
    return aaa_scores(gold, original, hashtag, attacks)


def test_hashtag_rule_zeroes_corr_scores_when_tpr_drops() -> None:
    result = _rule_case(hashtag_correct_pos=20, hashtag_correct_neg=50)
    assert result["hashtag_check"]["failed"] is True
    assert result["hashtag_check"]["tpr"]["significant_drop"] is True
    assert result["hashtag_check"]["tnr"]["significant_drop"] is False
    assert result["scores"] == {"quo_a_to_n": 1.0, "flip_n_to_a": 1.0, "corr_a_to_a": 0.0, "corr_n_to_n": 0.0}
    assert result["raw_scores"]["corr_a_to_a"] == pytest.approx(0.8)
    assert result["aaa"] == 0.0


def test_hashtag_rule_zeroes_corr_scores_when_tnr_drops() -> None:
    result = _rule_case(hashtag_correct_pos=50, hashtag_correct_neg=20)
    assert result["hashtag_check"]["failed"] is True and result["hashtag_check"]["tnr"]["significant_drop"] is True


def test_hashtag_rule_keeps_corr_scores_when_no_significant_drop() -> None:
    result = _rule_case(hashtag_correct_pos=48, hashtag_correct_neg=50)  # 50/50 → 48/50: p > 0.05
    assert result["hashtag_check"]["failed"] is False
    assert result["scores"]["corr_a_to_a"] == pytest.approx(0.8)
    assert result["aaa"] == pytest.approx(0.8**0.25)


def test_geometric_mean() -> None:
    assert geometric_mean([0.5, 0.5, 0.5, 0.5]) == pytest.approx(0.5)
    assert geometric_mean([1.0, 0.25, 1.0, 1.0]) == pytest.approx(0.25**0.25)
    assert geometric_mean([0.9, 0.0, 0.8, 0.7]) == 0.0
    assert geometric_mean([0.9, None, 0.8, 0.7]) is None


def test_evaluate_aaa_with_a_keyword_scorer() -> None:
    train = [ex("you idiot", True), ex("loser", True), ex("lovely tea", False), ex("sunny day", False)]
    result = evaluate_aaa("toy", train, TEST, RESOURCES, {"model": KeywordScorer(["idiot", "loser"])}, seed=0)
    s = result["scorers"]["model"]
    assert s["original"]["accuracy"] == pytest.approx(100.0)
    assert s["scores"]["quo_a_to_n"] == 0.0  # quoting keeps the keyword → still flagged
    assert s["scores"]["flip_n_to_a"] == 1.0
    assert s["scores"]["corr_a_to_a"] == 1.0
    assert s["hashtag_check"]["failed"] is False  # "#idiot" still contains the keyword
    assert s["aaa"] == 0.0
    assert result["n"] == {"quo_a_to_n": 2, "flip_n_to_a": 3, "corr_a_to_a": 2, "corr_n_to_n": 3, "hashtag": 5}


def test_resources_from_the_data_dir() -> None:
    res = AAAResources.load(FIXTURE_DATA)
    assert len(res.templates) == 2 and all("<tweet>" in t for t in res.templates)
    assert len(res.skipped) == 1 and "<tweer>" in res.skipped[0]  # the upstream typo is skipped
    assert res.hurtlex == {"idiot", "stupid", "gag reel"}


def test_resources_missing_files_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="templates.txt"):
        AAAResources.load(tmp_path)
