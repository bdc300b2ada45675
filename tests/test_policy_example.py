"""docs/policy.example.toml starts from the defaults: every rule is commented out and explained, so a copy
changes no answer until a line is uncommented; its ``sed`` line turns every rule on (what docs/api.md's
policy server runs). The service's start-up line names the policy in force, or says there is none."""

from __future__ import annotations

import importlib.util
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from service_conftest import FakeClassifier, live_server

import dialogue_safety
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import load_policy, parse_policy
from dialogue_safety.core.schema import Label

REPO = Path(__file__).resolve().parents[1]
BUNDLED = REPO / "models" / "default"


def _docs_examples() -> ModuleType:
    if "docs_examples" not in sys.modules:
        spec = importlib.util.spec_from_file_location("docs_examples", REPO / "scripts" / "docs_examples.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["docs_examples"] = module
        spec.loader.exec_module(module)
    return sys.modules["docs_examples"]


docs_examples = _docs_examples()
EXAMPLE = docs_examples.POLICY_EXAMPLE
SED = re.compile(r"sed '(s/[^']+/)' docs/policy\.example\.toml > policy\.toml")


def test_the_example_as_shipped_has_no_rule() -> None:
    policy = load_policy(EXAMPLE, ModelCard.load(BUNDLED).heads)
    assert (dict(policy.categories), policy.block, policy.allow) == ({}, (), ())


def test_every_rule_of_the_example_is_explained_and_uncommenting_turns_it_on() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    lines = text.splitlines()
    rule_lines = [i for i, line in enumerate(lines) if docs_examples.RULE_LINE.match(line)]
    assert len(rule_lines) >= 8
    for i in rule_lines:  # a group of rule lines comes right after its explanation ("# ...")
        j = i - 1
        while docs_examples.RULE_LINE.match(lines[j]):
            j -= 1
        assert lines[j].startswith("# ") or lines[j] == "", (i + 1, lines[i])
        assert any(lines[k].startswith("# ") for k in range(max(0, j - 3), j + 1)), f"line {i + 1} is not explained"
    on = load_policy_text(docs_examples.rules_uncommented(text))
    assert dict(on.categories) == {"hateful": 0.6, "unsafe_in_context": None}
    assert [r.name for r in on.block] == ["banned-terms"] and [r.name for r in on.allow] == ["product-phrases"]


def load_policy_text(text: str) -> dialogue_safety.Policy:
    policy = parse_policy(text, "policy.toml")
    policy.check_heads(ModelCard.load(BUNDLED).heads)
    return policy


@pytest.mark.skipif(shutil.which("sed") is None, reason="needs sed")
def test_the_documented_sed_line_writes_what_the_docs_server_serves() -> None:
    """The `sed` line of the example and of docs/api.md is the one the generator's uncommenting stands for."""
    for doc in (EXAMPLE, REPO / "docs" / "api.md"):
        found = SED.search(doc.read_text(encoding="utf-8"))
        assert found is not None, f"{doc.name} shows no sed line that uncomments the example"
        run = subprocess.run(["sed", found.group(1), str(EXAMPLE)], capture_output=True, text=True, check=True)
        assert run.stdout == docs_examples.rules_uncommented(EXAMPLE.read_text(encoding="utf-8"))


def test_a_copy_of_the_example_leaves_the_readmes_answers_unchanged(tmp_path: Path) -> None:
    """Served with a copy of the example, every dialogue the README quotes gets the same answer; above all
    "Yes, you should definitely do it!" after "Should I hurt myself?" stays OFFENSIVE."""
    copy = tmp_path / "policy.toml"
    shutil.copy(EXAMPLE, copy)
    model = dialogue_safety.load(BUNDLED)
    policy = dialogue_safety.load_policy(copy)
    dialogues = [
        dialogue_safety.Example.from_texts(utterance, list(history))
        for utterance, history in docs_examples.PROBES.values()
    ]
    assert dialogue_safety.classify_batch(dialogues, model, policy=policy) == dialogue_safety.classify_batch(
        dialogues, model
    )
    utterance, history = docs_examples.PROBES["hurt"]
    assert dialogue_safety.classify(utterance, history, model, policy=copy).label is Label.OFFENSIVE
    uncommented = tmp_path / "on.toml"
    uncommented.write_text(docs_examples.rules_uncommented(EXAMPLE.read_text(encoding="utf-8")), encoding="utf-8")
    assert dialogue_safety.classify(utterance, history, model, policy=uncommented).label is Label.SAFE, (
        "the explanation of unsafe_in_context = 'off' says what it costs: the reply in context is no longer judged"
    )


def test_the_start_up_line_names_the_policy_in_force_or_says_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = tmp_path / "ours.toml"
    shutil.copy(EXAMPLE, copy)
    caplog.set_level(logging.INFO, logger="dialogue_safety.service.state")
    with live_server(classifier=FakeClassifier(), policy=copy):
        pass
    with live_server(classifier=FakeClassifier()):
        pass
    ready = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready: ")]
    assert len(ready) == 2
    assert f"operator policy: {copy};" in ready[0]
    assert "operator policy: none" in ready[1]
