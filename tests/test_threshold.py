"""The threshold in force, the one decision rule, and the threshold search checked against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
from service_conftest import FakeClassifier, live_server
from sklearn.metrics import f1_score

from dialogue_safety.core.scoring import is_offensive, threshold_in_force
from dialogue_safety.training.calibration import choose_threshold
from dialogue_safety.training.metrics import best_f1_threshold


def test_override_order_item_request_setting_card() -> None:
    assert threshold_in_force(0.4) == 0.4
    assert threshold_in_force(0.4, setting=0.3) == 0.3
    assert threshold_in_force(0.4, setting=0.3, request=0.2) == 0.2
    assert threshold_in_force(0.4, setting=0.3, request=0.2, item=0.1) == 0.1
    assert threshold_in_force(0.4, item=0.0) == 0.0  # 0 is a threshold, not "unset"


def test_the_decision_rule_includes_the_threshold() -> None:
    assert bool(is_offensive(0.5, 0.5)) and not bool(is_offensive(0.4999, 0.5))
    grid = is_offensive(np.array([0.2, 0.6])[None, :], np.array([0.1, 0.5, 0.9])[:, None])
    assert grid.tolist() == [[True, True], [False, True], [False, False]]


def test_the_api_applies_item_over_request_over_setting_over_card() -> None:
    # the fake scores every plain text 0.1 (card threshold 0.5)
    with live_server(classifier=FakeClassifier(threshold=0.5), threshold=0.05) as live, live.client() as c:
        assert live.url
        single = c.post("/v1/classify", json={"utterance": "hello"}).json()
        assert (single["threshold"], single["label"]) == (0.05, "OFFENSIVE")  # setting over card
        single = c.post("/v1/classify", json={"utterance": "hello", "threshold": 0.5}).json()
        assert (single["threshold"], single["label"]) == (0.5, "SAFE")  # request over setting
        batch = c.post(
            "/v1/classify/batch",
            json={"threshold": 0.5, "items": ["hello", {"utterance": "hello", "threshold": 0.05}]},
        ).json()["results"]
        assert [(r["threshold"], r["label"]) for r in batch] == [(0.5, "SAFE"), (0.05, "OFFENSIVE")]  # item wins
        assert c.get("/v1/model").json()["serving"]["threshold"] == 0.05
    with live_server(classifier=FakeClassifier(threshold=0.08)) as live, live.client() as c:
        assert c.post("/v1/classify", json={"utterance": "hello"}).json()["threshold"] == 0.08  # the card's


@pytest.mark.parametrize("seed", range(5))
def test_threshold_search_matches_scikit_learn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, size=300)
    scores = np.clip(gold * 0.25 + rng.random(300) * 0.75, 0, 1).round(3)  # ties on purpose
    threshold, f1 = best_f1_threshold(gold, scores)
    assert f1 == pytest.approx(100 * f1_score(gold, scores >= threshold))
    # no other cut does better (sklearn's F1 at every distinct score)
    assert f1 >= max(100 * f1_score(gold, scores >= c) for c in np.unique(scores)) - 1e-9
    # the macro objective reports each source's F1 as sklearn computes it at the chosen threshold
    other = rng.integers(0, 2, size=120)
    per_source = {"a": (gold, scores), "b": (other, rng.random(120))}
    chosen, at = choose_threshold(per_source, "macro")
    for name, (g, s) in per_source.items():
        assert at[name] == pytest.approx(100 * f1_score(g, s >= chosen, zero_division=0))
