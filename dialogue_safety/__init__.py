"""Context-aware dialogue safety: is the last message of a conversation offensive, given what came before it?

    import dialogue_safety

    dialogue_safety.classify("you are an idiot").label  # <Label.OFFENSIVE: 'OFFENSIVE'>
    dialogue_safety.classify("so what", history=["I lost my job today"])  # Prediction(score, label, threshold, ...)

    model = dialogue_safety.load()  # the bundled model; or load("path/to/model_dir", variant="int8")
    dialogue_safety.classify_batch(["you are a clown", dialogue_safety.Example.from_texts("ok", ["hi"])], model=model)

    chat = [{"role": "user", "content": "I lost my job today"}, {"role": "assistant", "content": "so what"}]
    dialogue_safety.classify_messages(chat)  # the last message judged, the earlier ones its history
    dialogue_safety.classify_conversation(chat)  # every turn judged, each given the turns before it

    policy = dialogue_safety.load_policy("policy.toml")  # operator rules (docs/policy.example.toml)
    dialogue_safety.classify("try our snake oil", policy=policy).policy  # the rule that decided, or None

    client = dialogue_safety.Client("http://localhost:8000", api_key="...")  # the same calls over HTTP
    client.classify("you are a clown")

:func:`load` returns the torch-free :class:`~dialogue_safety.core.runtime.OnnxClassifier` of a model
directory (default: the bundled model, found as ``dialogue-safety serve`` finds it); :func:`classify`
judges one utterance after its history (oldest turn first), :func:`classify_batch` many dialogues in
one call, both on the bundled model (loaded once, on first use) unless given one; :func:`classify_messages`
judges the last of a list of OpenAI chat messages (:mod:`dialogue_safety.core.messages`). A label is the
model card's decision at its threshold unless ``threshold`` says otherwise, then the operator ``policy``'s
(:mod:`dialogue_safety.core.policy`) when one is given. :class:`Client` makes the same calls to a running
service (:mod:`dialogue_safety.client`, standard library only). Importing this package
loads no model, no torch and no web framework. The HTTP service, training, export and evaluation
live in the subpackages (``dialogue-safety --help``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dialogue_safety.core.messages import parse_messages
from dialogue_safety.core.policy import Policy, PolicyError, load_policy
from dialogue_safety.core.schema import Example, Label, Prediction, Turn, check_threshold, history_list

if TYPE_CHECKING:
    from dialogue_safety.client import Client
    from dialogue_safety.core.messages import TurnPrediction
    from dialogue_safety.core.runtime import OnnxClassifier

__all__ = [
    "Client",
    "Example",
    "Label",
    "Policy",
    "PolicyError",
    "Prediction",
    "Turn",
    "classify",
    "classify_batch",
    "classify_conversation",
    "classify_messages",
    "load",
    "load_policy",
]


def __dir__() -> list[str]:
    """The public names only (``dir(dialogue_safety)``, tab completion): not the helpers this module imports."""
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    """``Client`` is imported when first asked for: importing the package (or the runtime) loads no HTTP code."""
    if name == "Client":
        from dialogue_safety.client import Client

        return Client
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load(model_dir: str | Path | None = None, *, variant: str | None = None) -> OnnxClassifier:
    """The model directory ``model_dir`` (default: the bundled model) ready to predict, without torch.

    ``variant``: ``fp32``, ``optimized``, ``int8`` or ``fp16`` (default: the card's choice for this
    machine). Raises :class:`~dialogue_safety.core.runtime.ModelLoadError` for a directory that is not
    an exported model."""
    from dialogue_safety.core import language
    from dialogue_safety.core.model_dir import default_model_dir
    from dialogue_safety.core.runtime import OnnxClassifier
    from dialogue_safety.core.runtime_options import runtime_options

    # built as serve and score build theirs, with the language check on as the service runs it by default:
    # the same text gets the same answer here and over HTTP
    options = runtime_options(variant=variant, language_check=language.CHECK_BY_DEFAULT)
    return OnnxClassifier(default_model_dir() if model_dir is None else model_dir, **options)


_BUNDLED: list[OnnxClassifier] = []  # the bundled model, once loaded
_BUNDLED_LOCK = threading.Lock()  # threads calling classify() at start wait for the one load


def _bundled() -> OnnxClassifier:
    if _BUNDLED:  # loaded: no lock on the way to inference
        return _BUNDLED[0]
    with _BUNDLED_LOCK:
        if not _BUNDLED:
            _BUNDLED.append(load())
        return _BUNDLED[0]


def _turns(history: Sequence[str | Turn | Mapping[str, Any]]) -> tuple[Turn, ...]:
    """History turns from texts, :class:`Turn` objects or ``{"text", "speaker"?}`` objects (as the client sends)."""
    return tuple(
        t if isinstance(t, Turn) else Turn(t["text"], t.get("speaker")) if isinstance(t, Mapping) else Turn(t)
        for t in history_list(history)
    )


def classify(
    utterance: str,
    history: Sequence[str | Turn | Mapping[str, Any]] = (),
    model: OnnxClassifier | None = None,
    *,
    threshold: float | None = None,
    policy: Policy | str | Path | None = None,
) -> Prediction:
    """The prediction for ``utterance`` said after ``history`` (turns oldest first: texts, :class:`Turn` or
    ``{"text", "speaker"}`` objects)."""
    if not isinstance(utterance, str):
        raise TypeError(f"utterance must be a string, got {type(utterance).__name__}")
    [prediction] = classify_batch(
        [Example(utterance=utterance, history=_turns(history))], model, threshold=threshold, policy=policy
    )
    return prediction


def classify_messages(
    messages: Sequence[Mapping[str, Any]],
    model: OnnxClassifier | None = None,
    *,
    include_system: bool = False,
    threshold: float | None = None,
    policy: Policy | str | Path | None = None,
) -> Prediction:
    """The prediction for the last of ``messages`` (OpenAI chat format: ``role``, ``content`` a string or
    text parts), the earlier ones its history (system messages only with ``include_system``). Raises
    :class:`~dialogue_safety.core.errors.InvalidInput` naming a message that cannot be read."""
    judged = parse_messages(messages, include_system=include_system)
    [prediction] = classify_batch([judged.example], model, threshold=threshold, policy=policy)
    return prediction


def classify_conversation(
    conversation: Sequence[Mapping[str, Any] | str | Turn],
    model: OnnxClassifier | None = None,
    *,
    roles: Sequence[str] | None = None,
    include_system: bool = False,
    threshold: float | None = None,
    policy: Policy | str | Path | None = None,
) -> list[TurnPrediction]:
    """A verdict for every turn of ``conversation`` (OpenAI chat messages, or turns: texts or :class:`Turn`),
    each given the turns before it, in one call (``roles``: judge only these roles, or speakers; default: user
    and assistant messages, every turn). Raises :class:`~dialogue_safety.core.errors.InvalidInput` as
    :func:`classify_messages` does."""
    from dialogue_safety.core.messages import TurnPrediction, conversation_turns

    judged = conversation_turns(conversation, roles=roles, include_system=include_system)
    predictions = classify_batch([j.example for j in judged], model, threshold=threshold, policy=policy)
    return [TurnPrediction(j.index, j.role, p) for j, p in zip(judged, predictions, strict=True)]


def classify_batch(
    dialogues: Iterable[Example | str],
    model: OnnxClassifier | None = None,
    *,
    threshold: float | None = None,
    policy: Policy | str | Path | None = None,
) -> list[Prediction]:
    """One prediction per dialogue, in order; a plain string is an utterance without history.
    ``policy``: operator rules (a :class:`Policy`, or the path of a policy file, read on each call)."""
    examples = [d if isinstance(d, Example) else Example(utterance=d) for d in dialogues]
    if threshold is not None:
        threshold = check_threshold(threshold)  # as the service checks a request's
    classifier = model if model is not None else _bundled()
    predictions = classifier.predict(examples, threshold=threshold)
    if policy is None:
        return predictions
    rules = policy if isinstance(policy, Policy) else load_policy(policy, classifier.card.heads)
    return rules.apply_all(examples, predictions, classifier.card)
