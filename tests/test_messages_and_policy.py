"""Chat messages → the example judged (dialogue_safety.core.messages), and the operator policy
(dialogue_safety.core.policy): its file (errors with file, line and problem) and its rules on
predictions; then both through the Python API on the bundled model."""

from __future__ import annotations

from pathlib import Path

import pytest

import dialogue_safety
from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.messages import parse_messages
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.policy import PolicyError, load_policy, parse_policy
from dialogue_safety.core.runtime import OnnxClassifier
from dialogue_safety.core.schema import Example, Label, Prediction, Turn

REPO = Path(__file__).resolve().parents[1]
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "what do you think of my neighbours?"},
    {"role": "assistant", "content": [{"type": "text", "text": "they should all"}, {"type": "text", "text": "go"}]},
]


# -- messages ---------------------------------------------------------------------------------------
def test_the_last_message_is_judged_after_the_others_without_system_messages() -> None:
    judged = parse_messages(CHAT)
    assert judged.example == Example(
        utterance="they should all\ngo", history=(Turn("what do you think of my neighbours?", "user"),)
    )
    assert judged.judged() == {"index": 2, "role": "assistant"}
    kept = parse_messages(CHAT, include_system=True).example.history
    assert kept == (Turn("You are a helpful assistant.", "system"), Turn("what do you think of my neighbours?", "user"))
    tool = parse_messages([{"role": "assistant", "content": "calling"}, {"role": "tool", "content": "42"}])
    assert tool.example.history == (Turn("calling", "bot"),) and tool.role == "tool"


@pytest.mark.parametrize(
    ("messages", "code", "field", "words"),
    [
        ([], "invalid_message", "messages", "empty"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "unsupported_content",
            "messages[0].content[0]",
            "'image_url' part",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}],
            "invalid_message",
            "messages[1].role",
            "one of system, developer, user, assistant, tool",
        ),
        ([{"role": "user"}], "invalid_message", "messages[0].content", "missing"),
        (["hi"], "invalid_message", "messages[0]", "object"),
    ],
)
def test_messages_that_cannot_be_read_are_named(messages: list, code: str, field: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_messages(messages)
    assert (caught.value.code, caught.value.field) == (code, field)
    assert words in caught.value.message


# -- the policy file ----------------------------------------------------------------------------------
GOOD = """\
[categories]
hateful = 0.3
unsafe_in_context = "off"

[[block]]
name = "banned-terms"
terms = ["snake oil"]
regexes = ['\\bscam+y?\\b']

[[allow]]
name = "product-phrases"
phrases = ["Kill the child process"]
"""


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("[categories]\nhateful = 0.3\nhateful = 0.4\n", 3, "not valid TOML"),
        ("[categories]\noffensive = 0.5\nhateful = 2\n", 3, "categories.hateful must be a threshold in [0, 1]"),
        ('[categories]\nhateful = "of"\n', 2, 'or "off"'),
        (
            '[[block]]\nname = "a"\nterms = ["x"]\n\n[[block]]\nname = "b"\nregexes = ["("]\n',
            7,
            "block[1].regexes[0] is not a valid regex",
        ),
        ('[[block]]\nterms = ["x"]\n', 1, "block[0].name is required"),
        ('[[allow]]\nname = "a"\nphrases = ["x"]\nphrase = ["y"]\n', 4, "unknown key 'phrase'"),
        (
            '[[allow]]\nname = "a"\nphrases = ["x"]\n[[block]]\nname = "a"\nterms = ["y"]\n',
            5,
            "the rule name 'a' is used twice",
        ),
        ("thresholds = 1\n", 1, "unknown key 'thresholds'"),
    ],
)
def test_a_bad_policy_file_is_refused_with_file_line_and_problem(
    tmp_path: Path, text: str, line: int, words: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.line == line, str(caught.value)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert words in caught.value.problem


def test_a_policy_nested_too_deeply_for_the_toml_parser_is_refused_not_crashed(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("hateful = " + "[" * 3000 + "]" * 3000 + "\n", encoding="utf-8")
    with pytest.raises(PolicyError, match=r"deep.toml: not valid TOML: arrays or inline tables nested too deeply"):
        load_policy(path)


def test_many_rules_are_located_by_line_one_table_header_scan(tmp_path: Path) -> None:
    """Each rule's line comes from one scan of the file's headers (a machine-written policy has a rule per
    term): the 3,000th rule's duplicate name is reported at its own line."""
    rules = "".join(f'[[block]]\nname = "r{i}"\nterms = ["w{i}"]\n' for i in range(3000))
    path = tmp_path / "many.toml"
    path.write_text(rules + '[[block]]\nname = "r7"\nterms = ["x"]\n', encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert caught.value.line == 3 * 3000 + 2 and "'r7' is used twice" in caught.value.problem


def test_a_category_the_model_lacks_is_named_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("# rules\n[categories]\nviolence = 0.2\n", encoding="utf-8")
    with pytest.raises(PolicyError, match=r"policy.toml:3: categories.violence: the model has no 'violence' head"):
        load_policy(path, heads=["offensive", "hateful"])


# -- the rules on predictions --------------------------------------------------------------------------
CARD = ModelCard(heads=["offensive", "hateful", "unsafe_in_context"], score_heads=["offensive", "unsafe_in_context"])


def prediction(offensive: float, hateful: float = 0.0, unsafe: float = 0.0, threshold: float = 0.5) -> Prediction:
    score = max(offensive, unsafe)
    cats = {"offensive": offensive, "hateful": hateful, "unsafe_in_context": unsafe}
    return Prediction(score=score, label=Label.from_bool(score >= threshold), threshold=threshold, categories=cats)


def test_block_terms_match_whole_words_of_the_normalised_text_and_force_offensive() -> None:
    policy = parse_policy(GOOD)
    for text in ("buy our SNAKE   oil now", "buy our ｓｎａｋｅ oil", "so scammy!"):
        out = policy.apply(Example(utterance=text), prediction(0.1), CARD)
        assert (out.label, out.policy, out.score) == (Label.OFFENSIVE, "banned-terms", 0.1), text
    untouched = prediction(0.1)
    for text in ("snake oils are fine", "a rattlesnake oil", "scampi"):
        assert policy.apply(Example(utterance=text), untouched, CARD) is untouched, text


def test_an_allow_phrase_is_an_exact_normalised_match_and_forces_safe() -> None:
    policy = parse_policy(GOOD)
    out = policy.apply(Example(utterance="  kill the CHILD process "), prediction(0.9), CARD)
    assert (out.label, out.policy) == (Label.SAFE, "product-phrases")
    longer = policy.apply(Example(utterance="kill the child process and you"), prediction(0.9), CARD)
    assert (longer.label, longer.policy) == (Label.OFFENSIVE, None)


def test_category_thresholds_and_off_change_the_label_and_name_the_category() -> None:
    policy = parse_policy(GOOD)  # hateful = 0.3 decides too; unsafe_in_context is off
    hate = policy.apply(Example(utterance="x"), prediction(0.1, hateful=0.35), CARD)
    assert (hate.label, hate.policy) == (Label.OFFENSIVE, "categories.hateful")
    off = policy.apply(Example(utterance="x"), prediction(0.1, unsafe=0.8), CARD)
    assert (off.label, off.policy) == (Label.SAFE, "categories.unsafe_in_context")
    same = prediction(0.9, unsafe=0.8)  # offensive alone decides: the policy changed nothing
    assert policy.apply(Example(utterance="x"), same, CARD) is same
    strict = parse_policy("[categories]\noffensive = 0.2\n")
    low = policy.apply(Example(utterance="x"), prediction(0.25), CARD)
    assert low.label is Label.SAFE
    flipped = strict.apply(Example(utterance="x"), prediction(0.25), CARD)
    assert (flipped.label, flipped.policy) == (Label.OFFENSIVE, "categories.offensive")


# -- the Python API ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bundled() -> OnnxClassifier:
    return dialogue_safety.load()


def test_the_python_api_applies_a_policy_and_reads_chat_messages(bundled: OnnxClassifier, tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[[block]]\nname = "no-fruit"\nterms = ["banana"]\n', encoding="utf-8")
    plain = dialogue_safety.classify("I like banana bread", model=bundled)
    assert plain.label is Label.SAFE and plain.policy is None
    policy = dialogue_safety.load_policy(path)
    blocked = dialogue_safety.classify("I like banana bread", model=bundled, policy=policy)
    assert (blocked.label, blocked.policy, blocked.score) == (Label.OFFENSIVE, "no-fruit", plain.score)
    by_path = dialogue_safety.classify_batch(["banana", "have a nice day"], bundled, policy=path)
    assert [p.policy for p in by_path] == ["no-fruit", None]
    chat = dialogue_safety.classify_messages(CHAT, bundled)
    assert chat == dialogue_safety.classify("they should all\ngo", [Turn(CHAT[1]["content"], "user")], bundled)
