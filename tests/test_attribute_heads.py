"""Attribute heads (violence, unsafe_request): taught only where a source labels the attribute, and
present in a model only when some training source does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dialogue_safety.core.schema import UNSAFE_REQUEST, VIOLENCE, Label, LabelFamily
from dialogue_safety.training.harmonise import ATTRIBUTE_HEADS, HEAD_ORDER, attribute_heads, harmonised_targets
from dialogue_safety.training.heads import head_names
from dialogue_safety.training.mixture import TaskData
from dialogue_safety.training.recipe import TaskSpec, load_recipe
from tests.test_counter_speech_sources import _ex


def test_attribute_heads_learn_their_bool_and_nothing_else() -> None:
    examples = [
        _ex(Label.OFFENSIVE, LabelFamily.HATEFUL, **{VIOLENCE: True}),  # a call for violence
        _ex(Label.OFFENSIVE, LabelFamily.HATEFUL, **{VIOLENCE: False}),  # hate, no violence
        _ex(Label.SAFE, LabelFamily.OFFENSIVE, **{VIOLENCE: False}),
        _ex(Label.OFFENSIVE, LabelFamily.UNSAFE_IN_CONTEXT, **{UNSAFE_REQUEST: True}),  # a harmful request
        _ex(Label.SAFE, LabelFamily.UNSAFE_IN_CONTEXT, **{UNSAFE_REQUEST: False}),  # its look-alike
        _ex(Label.OFFENSIVE, LabelFamily.OFFENSIVE, ("hi",)),  # a source that labels neither
    ]
    heads = list(HEAD_ORDER)
    for decomposed in (False, True):
        y, mask = harmonised_targets(examples, heads, np.zeros(len(examples), dtype=bool), decomposed=decomposed)
        v, r = heads.index(VIOLENCE), heads.index(UNSAFE_REQUEST)
        assert mask[:, v].tolist() == [1, 1, 1, 0, 0, 0] and y[:3, v].tolist() == [1, 0, 0]
        assert mask[:, r].tolist() == [0, 0, 0, 1, 1, 0] and y[3:5, r].tolist() == [1, 0]
        # the family heads are unchanged by the attributes: hate teaches hateful either way
        assert y[0, heads.index("hateful")] == y[1, heads.index("hateful")] == 1
    assert attribute_heads(examples) == set(ATTRIBUTE_HEADS)


def test_a_model_has_an_attribute_head_only_when_a_training_source_labels_it() -> None:
    recipe = load_recipe("tiny", ['heads="harmonised"'])
    plain = [_ex(Label.SAFE, LabelFamily.OFFENSIVE)]
    task = TaskData(TaskSpec("s"), plain, [], [])
    assert VIOLENCE not in head_names(recipe, [task])
    task.train.append(_ex(Label.OFFENSIVE, LabelFamily.HATEFUL, **{VIOLENCE: True}))
    assert head_names(recipe, [task]) == ["offensive", "hateful", VIOLENCE]


def test_the_labelling_sources_say_it_on_every_row(tmp_path: Path) -> None:
    from dialogue_safety.sources.registry import load_source

    rows = load_source("requests", tmp_path)
    requests = [r for r in rows if r.metadata["kind"] == "request"]
    assert requests and all(r.metadata[UNSAFE_REQUEST] == r.label.is_positive for r in requests)
    assert all(UNSAFE_REQUEST not in r.metadata for r in rows if r.metadata["kind"] != "request")
