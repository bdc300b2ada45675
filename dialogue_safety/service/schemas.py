"""The request and response schemas of the API: classification (``/v1/classify``, ``/v1/classify/batch``,
``/v1/classify/conversation``), OpenAI chat messages in them, and OpenAI's moderation (``/v1/moderations``).

Pydantic models only: :mod:`dialogue_safety.service.routes` and :mod:`dialogue_safety.service.moderations`
answer with them, :mod:`dialogue_safety.service.app` names :data:`REQUEST_FIELDS` to the error table (an unknown
field is answered with the closest known one), and :mod:`dialogue_safety.service.openapi` writes the request
limits into their OpenAPI schemas.

``/v1/classify`` and each object item of ``/v1/classify/batch`` accept ``messages`` (OpenAI chat format,
:class:`ChatFields`) instead of ``history`` + ``utterance``; the rules (which message is judged, what becomes
history, which parts are text) are :mod:`dialogue_safety.core.messages`'s, shared with ``score`` and the Python
API. The answer says which message was judged (``judged``: index and role).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
)

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.messages import ROLES
from dialogue_safety.core.schema import THRESHOLD_RANGE
from dialogue_safety.service.errors import ErrorInfo, from_errors


class ChatMessage(BaseModel):
    """One OpenAI chat message; other keys (``name``, ``tool_call_id``...) are read past. ``developer`` is read as
    ``system``; an assistant message that only calls tools (``tool_calls``, null content) and ``tool`` messages
    are skipped as context (:mod:`dialogue_safety.core.messages`, which checks role and content: its errors name
    the field as sent, ``messages[1].content``)."""

    model_config = ConfigDict(extra="allow")
    role: Any = Field(description=f"one of {', '.join(ROLES)}")
    content: Any = Field(
        None,
        description="a string, or a list of text parts {'type': 'text', 'text': ...} (other parts are refused); "
        "it must show some text (null only in an assistant message with tool_calls)",
    )

    def as_sent(self) -> dict[str, Any]:
        """The message as the client sent it (role, content and the other keys), for the readers of messages."""
        return self.model_dump()


class ChatFields(BaseModel):
    """The request fields of chat messages (a dialogue item has these or history + utterance)."""

    messages: list[ChatMessage] | None = Field(
        None,
        description="instead of history + utterance: OpenAI chat messages; the last one is judged, the earlier ones "
        "are its history (system messages only with include_system)",
    )
    include_system: bool = Field(False, strict=True, description="with messages: keep system messages in the history")

    @field_validator("utterance", "messages", mode="before", check_fields=False)
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # left out, these default to None; sent as null they would say nothing of which one was meant
        if value is None:
            raise ValueError("null is not accepted; leave the field out instead")
        return value


class Judged(BaseModel):
    """Which message of ``messages`` was judged."""

    index: int = Field(ge=0, description="its index in messages")
    role: str


def _object_or_string(value: Any) -> str:
    return "string" if isinstance(value, str) else "object"


class TurnIn(BaseModel):
    """One turn of dialogue history."""

    model_config = ConfigDict(extra="forbid")
    speaker: str | None = Field(None, max_length=64, strict=True, description="free text: user, bot, P1...")
    text: str = Field(strict=True, description="what was said")


HistoryEntry = Annotated[
    Annotated[TurnIn, Tag("object")] | Annotated[str, Tag("string")], Discriminator(_object_or_string)
]
Threshold = Annotated[
    float | None,
    Field(
        ge=THRESHOLD_RANGE[0],
        le=THRESHOLD_RANGE[1],
        strict=True,  # a number: not true/false, not "0.5"
        description="decision threshold for this request (default: the model's)",
    ),
]


class DialogueItem(ChatFields):
    """The utterance to judge and the dialogue before it (oldest turn first), or chat ``messages``."""

    model_config = ConfigDict(extra="forbid")
    history: list[HistoryEntry] = Field(
        default_factory=list, description="earlier turns, oldest first: objects {speaker, text} or strings"
    )
    utterance: str | None = Field(
        None,
        strict=True,
        description="the message to classify, judged in the context of the history (required unless messages are sent)",
    )
    threshold: Threshold = None


class ClassifyRequest(DialogueItem):
    """One dialogue item, optionally with a word-level explanation of its score."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "history": [
                        {"speaker": "user", "text": "what do you think of my neighbours?"},
                        {"speaker": "bot", "text": "I don't know them. What are they like?"},
                    ],
                    "utterance": "they should all be thrown out of the country",
                },
                {"history": ["hi!", "hello, how are you?"], "utterance": "great, thanks", "threshold": 0.7},
                {"utterance": "you are a clown", "explain": True},
            ]
        },
    )
    explain: bool = Field(
        False,
        strict=True,
        description="add per-word contributions to the score (Shapley values by default; see explain_method)",
    )
    explain_history: bool = Field(False, strict=True, description="with explain: explain the history turns' words too")
    explain_method: Literal["shapley", "occlusion"] = Field(
        "shapley",
        description="with explain: shapley (sees redundant words: both insults of 'stupid idiot' count) or "
        "occlusion (leave one word out; cheaper for a few words)",
    )


class InvalidItem:
    """A batch item that is not a string or a dialogue item object (another type, an unknown or
    missing field...): it gets an error in its own slot, as an item that breaks a limit does."""

    __slots__ = ("errors",)

    def __init__(self, errors: list[Any]) -> None:
        self.errors = errors

    def error(self, prefix: str) -> InvalidInput:
        roots = [e for e in self.errors if tuple(e.get("loc", ()))[1:] == ()]  # the item itself, not a field
        if roots and len(roots) == len(self.errors):
            got = _json_type(roots[0].get("input"))
            message = f"{prefix.rstrip('.')} must be a string or an object with an utterance; got {got}"
            return InvalidInput(message, code="invalid_item", field=prefix.rstrip("."))
        inside = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in self.errors]  # without the union's tag
        error = from_errors(inside, REQUEST_FIELDS, prefix)
        return error if isinstance(error, InvalidInput) else InvalidInput(error.message, field=error.field)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else type(value).__name__


def _item_or_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError as exc:
        return InvalidItem(exc.errors(include_url=False))


BatchEntry = Annotated[
    Annotated[Annotated[DialogueItem, Tag("object")] | Annotated[str, Tag("string")], Discriminator(_object_or_string)],
    WrapValidator(_item_or_error),  # an item that does not validate is reported in its slot (InvalidItem)
]


class BatchRequest(BaseModel):
    """Many items at once; a plain string is a comment without history."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "items": [
                        "you are all idiots",
                        {"history": ["I made soup"], "utterance": "looks disgusting"},
                        {"utterance": "have a nice day", "threshold": 0.9},
                    ],
                    "threshold": 0.5,
                }
            ]
        },
    )
    items: list[BatchEntry] = Field(description="items to classify; results come back in this order")
    threshold: Threshold = None
    item_errors: Literal["report", "fail"] = Field(
        "report",
        description="report: an item that breaks a limit gets {'error': ...} in its own slot and the others are "
        "classified; fail: the whole request is refused (422) on the first such item",
    )


class ConversationRequest(BaseModel):
    """A whole conversation, every turn (or every turn of ``roles``) judged given the turns before it."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "messages": [
                        {"role": "user", "content": "Should I hurt myself?"},
                        {"role": "assistant", "content": "Yes, you should definitely do it!"},
                    ],
                    "roles": ["assistant"],
                },
                {"turns": [{"speaker": "A", "text": "I made soup"}, {"speaker": "B", "text": "looks disgusting"}]},
            ]
        },
    )
    messages: list[ChatMessage] | None = Field(
        None,
        description="OpenAI chat messages, oldest first (or turns); system and developer messages are history only "
        "with include_system, tool calls and tool results are skipped",
    )
    turns: list[HistoryEntry] | None = Field(
        None, description="instead of messages: the turns, oldest first: objects {speaker, text} or strings"
    )
    roles: list[str] | None = Field(
        None,
        description="judge only the messages of these roles (default: user and assistant); with turns: only the turns "
        "of these speakers (default: every turn)",
    )
    include_system: bool = Field(False, strict=True, description="with messages: keep system messages in the history")
    threshold: Threshold = None


#: the field names of the request models (an unknown field is answered with the closest of them)
REQUEST_FIELDS = frozenset(ClassifyRequest.model_fields) | frozenset(BatchRequest.model_fields)
REQUEST_FIELDS |= frozenset(TurnIn.model_fields) | frozenset(ConversationRequest.model_fields)


class Truncation(BaseModel):
    """What the model did not read of an item."""

    utterance_chars_unread: int = Field(
        ge=0,
        description="characters at the end of the utterance past the last window read (0 unless a window cap cut "
        "it; the API refuses such items with too_many_windows, so 0 here)",
    )
    history_turns_dropped: int = Field(
        ge=0,
        description="history turns (oldest first) not read at all: the model's token budget for the history "
        "(~30 tokens beside a long utterance, the rest of 128 beside a short one) or its max_history_turns left "
        "no room for them",
    )


class Classification(BaseModel):
    label: Literal["OFFENSIVE", "SAFE"] = Field(description="OFFENSIVE when score >= threshold")
    score: float = Field(ge=0.0, le=1.0, description="calibrated probability that the utterance is offensive")
    threshold: float = Field(description="the threshold the label was decided at")
    categories: dict[str, float] = Field(description="calibrated probability per model head (label family)")
    windows: int = Field(
        ge=1,
        description="windows the utterance was read in: 1 when it fits the model's input (~125 tokens, ~500 "
        "characters of prose), more for a long message, read whole in overlapping windows (each with the same "
        "history); the score is the highest over the windows",
    )
    language: str | None = Field(
        None,
        description="the utterance's language (ISO 639-1), 'und' when it cannot be told with confidence (short "
        "texts often); absent when the service's language check is off (SAFETY_LANGUAGE_CHECK)",
    )
    language_supported: bool | None = Field(
        None,
        description="false when the utterance is confidently in a language the model does not read, or not in Latin "
        "script (it is English-only): the verdict is still given, but it is not to be trusted; null with 'und'",
    )
    truncated: Truncation | None = Field(None, description="only when part of the item was not read: what was left out")


class WordContribution(BaseModel):
    word: str = Field(description="the word, text[start:end] of the text it comes from")
    start: int = Field(description="character offset of the word in that text")
    end: int
    contribution: float | None = Field(
        description="the word's share of score - baseline (shapley) or score - score without this word "
        "(occlusion); > 0 pushes towards OFFENSIVE; null: not explained"
    )


class Explanation(BaseModel):
    method: Literal["shapley", "occlusion"] = Field(
        description="shapley: Shapley values over words (KernelSHAP); occlusion: leave one word out"
    )
    score: float = Field(description="the score being explained (the response's score)")
    baseline: float | None = Field(
        None, description="shapley: the score without any explained word; the contributions add up to score - baseline"
    )
    exact: bool | None = Field(None, description="shapley: every coalition was scored (up to 6 words)")
    coalitions: int | None = Field(None, description="shapley: coalitions scored")
    utterance: list[WordContribution]
    history: list[list[WordContribution]] | None = Field(None, description="per turn, when explain_history")
    unexplained_words: int = Field(description="words past the per-request cap, with contribution null")


class ClassifyResponse(Classification):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "label": "OFFENSIVE",
                    "score": 0.93,
                    "threshold": 0.5,
                    "model": "dialogue-safety@1.0.0",
                    "categories": {"offensive": 0.93},
                    "windows": 1,
                    "language": "en",
                    "language_supported": True,
                },
                {
                    "label": "OFFENSIVE",
                    "score": 0.91,
                    "threshold": 0.5,
                    "model": "dialogue-safety@1.0.0",
                    "categories": {"offensive": 0.91},
                    "windows": 8,
                    "language": "en",
                    "language_supported": True,
                    "truncated": {"utterance_chars_unread": 0, "history_turns_dropped": 5},
                },
            ]
        }
    )
    model: str = Field(description="<name>@<version> of the model that answered")
    explanation: Explanation | None = Field(None, description="only when the request set explain")
    judged: Judged | None = Field(None, description="only for messages: the message judged")
    policy: str | None = Field(None, description="only when an operator policy rule decided or changed the label")


class ItemError(BaseModel):
    """The slot of a batch item that could not be classified (no label, no score)."""

    error: ErrorInfo


class BatchResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "results": [
                        {
                            "label": "OFFENSIVE",
                            "score": 0.97,
                            "threshold": 0.5,
                            "categories": {"offensive": 0.97},
                            "windows": 1,
                            "language": "en",
                            "language_supported": True,
                        },
                        {
                            "label": "SAFE",
                            "score": 0.06,
                            "threshold": 0.5,
                            "categories": {"offensive": 0.06},
                            "windows": 1,
                            "language": "fr",
                            "language_supported": False,
                        },
                        {
                            "error": {
                                "code": "empty_utterance",
                                "message": "the utterance is empty; send the text to classify",
                                "field": "items[2].utterance",
                            }
                        },
                    ],
                    "errors": 1,
                    "model": "dialogue-safety@1.0.0",
                }
            ]
        }
    )
    results: list[Classification | ItemError] = Field(
        description="one result per item, in the order of the items: a classification, or {'error': ...} for an "
        "item that could not be classified"
    )
    errors: int = Field(description="how many slots of results hold an error instead of a classification")
    model: str


class TurnClassification(Classification):
    """One judged turn of a conversation: its verdict given the turns before it."""

    policy: str | None = Field(None, description="only when an operator policy rule decided or changed the label")
    index: int = Field(ge=0, description="the turn's index in messages (or turns)")
    role: str = Field(description="the message's role (with turns: the turn's speaker, '' without one)")


class ConversationResponse(BaseModel):
    results: list[TurnClassification] = Field(description="one verdict per judged turn, in the conversation's order")
    model: str = Field(description="<name>@<version> of the model that answered")


class Status(BaseModel):
    status: str
    model: str | None = None


# -- OpenAI's moderation (/v1/moderations) -------------------------------------------------------------
class TextInput(BaseModel):
    """A text part, as OpenAI's multi-modal moderation input has them (other kinds are refused)."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(description="'text' (other part types are refused: we judge text only)")
    text: str | None = None


class ModerationRequest(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"input": "you are a clown"},
                {"input": ["have a nice day", "you are all idiots"], "model": "dialogue-safety"},
                {
                    "input": "so what",
                    "conversation": [{"role": "user", "content": "my dog died this morning"}],
                },
            ]
        },
    )
    input: str | list[str] | list[TextInput] = Field(
        description="a text, a list of texts (one result each), or a list of text parts (one result, parts joined)"
    )
    model: str | None = Field(None, description="accepted for compatibility; the answer names the model that judged")
    conversation: list[ChatMessage] | None = Field(
        None,
        description="extension: chat messages said before the input; each input is judged as the next message",
    )
    include_system: bool = Field(False, strict=True, description="with conversation: keep system messages")


class ModerationResult(BaseModel):
    flagged: bool = Field(description="true exactly when a category is")
    categories: dict[str, bool] = Field(
        description="per category: its score is at or above its own threshold (GET /v1/model: category_thresholds, "
        "or the operator policy's)"
    )
    category_scores: dict[str, float] = Field(description="per category: the calibrated probability")
    category_applied_input_types: dict[str, list[Literal["text"]]]
    scores_only: dict[str, float] | None = Field(
        None,
        description="extension: the heads too weak to decide (no category threshold), under their own names: a "
        "score, never a category",
    )
    policy: str | None = Field(None, description="extension: the operator policy rule that decided or changed it")


class ModerationResponse(BaseModel):
    id: str = Field(description="modr-<hex>")
    model: str = Field(description="<name>@<version> of the model that judged")
    results: list[ModerationResult]
