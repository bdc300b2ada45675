"""One input row → one :class:`Example` or one row error; one prediction → one output record.

Input rows are dicts (a JSONL object, a CSV row, a Parquet row). Which fields hold what is
data (:class:`Columns`): the utterance (``utterance``, else ``text``), an optional history (a
list of strings or ``{"speaker", "text"}`` objects, or that list as a JSON string, as CSV
cells must be), an optional id carried through, and optional extra columns carried through.
A row with a ``messages`` field is a chat transcript instead (OpenAI chat messages, or their JSON
string): its last message is judged after the others, read as ``/v1/classify`` reads ``messages``
(:mod:`dialogue_safety.core.messages`; system messages only with ``include_system``). With
``every_turn`` (``score --every-turn``), a transcript's record also holds ``turns``: a verdict for every
message of ``roles`` (default: user and assistant), each judged after the messages before it
(:func:`dialogue_safety.core.messages.every_turn`, as ``/v1/classify/conversation`` reads them); the
record's own fields stay those of the last message, so one input row is still one output record.

A row that cannot be scored becomes an output record with ``error = {"code", "message",
"field"}`` (the API's error shape; the per-item limits are the API's own,
:class:`dialogue_safety.core.limits.Limits`) and null scores: it is written and counted, never dropped.

Output records hold nested values (``categories``, ``error``, ``explanation``) as objects;
:func:`flatten` turns them into JSON strings for the flat formats (CSV, Parquet) and
:func:`unflatten` back, so every engine and format writes the same information.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dialogue_safety.core import json_input
from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.explain import Method
from dialogue_safety.core.limits import Limits, check_text, is_text
from dialogue_safety.core.messages import JudgedMessages, every_turn, parse_messages
from dialogue_safety.core.schema import Example, Prediction, Turn

if TYPE_CHECKING:
    from dialogue_safety.core.policy import Policy

UTTERANCE_FIELDS = ("utterance", "text")  # tried in this order when no field is named
RESULT_FIELDS = ("label", "score", "threshold", "categories", "windows", "truncated", "error")
EXPLANATION_FIELD = "explanation"
TURNS_FIELD = "turns"  # with every_turn: a transcript's verdict per judged message (else null)
POLICY_FIELD = "policy"  # with an operator policy: the rule that decided or changed the label (else null)
NESTED_FIELDS = frozenset({"categories", "truncated", "error", EXPLANATION_FIELD, TURNS_FIELD})


@dataclass(frozen=True)
class Columns:
    """Which input fields hold the utterance, history and id, and which others to carry through."""

    utterance: str | None = None  # None: "utterance", else "text"
    history: str | None = "history"
    id: str | None = "id"
    carry: tuple[str, ...] = ()
    messages: str | None = "messages"  # a row with this field is a chat transcript (None: never)
    include_system: bool = False  # transcripts: keep system messages in the history
    every_turn: bool = False  # transcripts: a verdict for every message (of roles) too, in the turns field
    roles: tuple[str, ...] | None = None  # with every_turn: the roles judged (None: user and assistant)

    def carried(self) -> list[str]:
        """Input fields copied to the output: the id, then ``carry``."""
        head = [self.id] if self.id else []
        return [*head, *(c for c in self.carry if c != self.id)]

    def output_fields(self, explain: bool = False, policy: bool = False) -> list[str]:
        """The output columns, in order (the same for every chunk, engine and format)."""
        fields = [*self.carried(), *RESULT_FIELDS, *([POLICY_FIELD] if policy else [])]
        fields += [TURNS_FIELD] if self.every_turn else []
        return [*fields, EXPLANATION_FIELD] if explain else fields


class RowError(ValueError):
    """A row that cannot be scored: ``code``, ``message`` and ``field`` as in the API's errors."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.field = code, message, field

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "field": self.field}


@dataclass
class Row:
    """One input row after parsing: its example, or the error that stops it from being scored."""

    where: str  # "file:line" for messages
    raw: Mapping[str, Any] = field(default_factory=dict)
    example: Example | None = None
    error: RowError | None = None
    turns: list[JudgedMessages] | None = None  # with every_turn: a transcript's messages to judge


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN from pandas/pyarrow
    except (TypeError, ValueError):
        return False


def _history(value: Any, name: str) -> tuple[Turn, ...]:
    if _is_missing(value) or (isinstance(value, str) and not value.strip()):
        return ()
    if isinstance(value, str):
        try:
            value = json_input.loads(value)  # depth checked before parsing: a hostile cell is an error row
        except json.JSONDecodeError as exc:
            raise RowError(
                "invalid_history", f"{name} is not a JSON list of turns ({exc.msg} at character {exc.pos})", name
            ) from None
        except json_input.JsonInputError as exc:
            raise RowError("invalid_history", f"{name} is not a JSON list of turns to read ({exc})", name) from None
    if hasattr(value, "tolist"):  # numpy arrays from pyarrow/pandas
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise RowError("invalid_history", f"{name} must be a list of turns, got {type(value).__name__}", name)
    turns = []
    for i, turn in enumerate(value):
        if isinstance(turn, str):
            turns.append(Turn(turn))
        elif isinstance(turn, Mapping) and isinstance(turn.get("text"), str):
            speaker = turn.get("speaker")
            turns.append(Turn(turn["text"], None if _is_missing(speaker) else str(speaker)))
        else:
            raise RowError(
                "invalid_history", f"{name}[{i}] must be a string or an object with a 'text' string", f"{name}[{i}]"
            )
    return tuple(turns)


def _utterance_field(raw: Mapping[str, Any]) -> str:
    """The first of ``UTTERANCE_FIELDS`` with a value (a CSV with both columns fills one per row)."""
    present = [f for f in UTTERANCE_FIELDS if f in raw]
    filled = [f for f in present if not _is_missing(raw[f]) and raw[f] != ""]
    return (filled or present or [UTTERANCE_FIELDS[0]])[0]


def parse_row(raw: Mapping[str, Any], columns: Columns, limits: Limits, where: str = "") -> Row:
    """The example in ``raw``, or a :class:`RowError` saying why it cannot be scored (its message
    starts with ``where``, the file and line, when known)."""
    row = Row(where, raw)
    try:
        for name in columns.carried():  # written out as they are: each must be UTF-8 text
            try:
                check_text(raw.get(name), name)
            except InvalidInput as exc:
                raise RowError(exc.code, f"{name}: {exc.message}", exc.field) from None
        if columns.messages and not _is_missing(raw.get(columns.messages)):
            row.example, row.turns = _transcript(raw[columns.messages], columns, limits)
            return row
        name = columns.utterance or _utterance_field(raw)
        if name not in raw:
            fields = f"{name!r}" if columns.utterance else " or ".join(repr(f) for f in UTTERANCE_FIELDS)
            raise RowError("missing_utterance", f"the row has no {fields} field (choose one with --text-field)", name)
        utterance = raw[name]
        if _is_missing(utterance):
            utterance = ""
        if not isinstance(utterance, str):
            raise RowError("invalid_utterance", f"{name} must be a string, got {type(utterance).__name__}", name)
        turns = _history(raw.get(columns.history), columns.history) if columns.history else ()
        try:
            limits.check_item(utterance, [t.text for t in turns])
        except InvalidInput as exc:
            raise RowError(exc.code, exc.message, exc.field) from None
        row.example = Example(utterance=utterance, history=turns)
    except RowError as exc:
        row.error = RowError(exc.code, f"{where}: {exc.message}", exc.field) if where else exc
    return row


def _transcript(value: Any, columns: Columns, limits: Limits) -> tuple[Example, list[JudgedMessages] | None]:
    """The example a row's chat messages ask about (their last message judged), and with ``every_turn``
    every message of ``columns.roles`` to judge."""
    name = columns.messages or "messages"
    if isinstance(value, str):
        try:
            value = json_input.loads(value)  # depth and duplicate keys checked as for a history cell
        except json.JSONDecodeError as exc:
            raise RowError(
                "invalid_message", f"{name} is not a JSON list of messages ({exc.msg} at character {exc.pos})", name
            ) from None
    if hasattr(value, "tolist"):  # numpy arrays from pyarrow/pandas
        value = value.tolist()
    try:
        example = parse_messages(value, include_system=columns.include_system, field=name).example
        limits.check_item(example.utterance, [t.text for t in example.history])
        turns = None
        if columns.every_turn:
            turns = every_turn(value, roles=columns.roles, include_system=columns.include_system, field=name)
            for one in turns:
                try:
                    limits.check_item(one.example.utterance, [t.text for t in one.example.history])
                except InvalidInput as exc:
                    exc.field = one.message_field(exc.field, where=name)
                    raise
    except InvalidInput as exc:
        raise RowError(exc.code, exc.message, exc.field) from None
    return example, turns


def unreadable_row(where: str, problem: str) -> Row:
    """A line that is not a row at all (e.g. invalid JSON): written as an error record."""
    return Row(where, {}, error=RowError("unreadable_row", f"{where}: {problem}"))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") and not isinstance(value, str | bytes) else value


def output_record(
    row: Row,
    columns: Columns,
    prediction: Prediction | None,
    explanation: Mapping[str, Any] | None = None,
    *,
    explain: bool = False,
    policy: bool = False,
    turns: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The output record of one row (nested values as objects; ``turns``: its verdict per judged message)."""
    out: dict[str, Any] = {}
    for name in columns.carried():
        value = row.raw.get(name)
        out[name] = None if _is_missing(value) or not is_text(value) else _plain(value)  # the row's error says why
    if prediction is None:
        error = row.error.as_dict() if row.error else {"code": "not_scored", "message": "not scored", "field": None}
        out.update(label=None, score=None, threshold=None, categories=None, windows=None, truncated=None, error=error)
    else:
        out.update(
            label=prediction.label.value,
            score=prediction.score,
            threshold=prediction.threshold,
            categories=dict(prediction.categories),
            windows=prediction.read.windows,  # what was read: as the API answers it
            truncated=prediction.reading().get("truncated"),
            error=None,
        )
    if policy:
        out[POLICY_FIELD] = prediction.policy if prediction is not None else None
    if explain:
        out[EXPLANATION_FIELD] = dict(explanation) if explanation is not None else None
    if columns.every_turn:
        out[TURNS_FIELD] = turns if prediction is not None else None
    return out


def turn_record(judged: JudgedMessages, prediction: Prediction | None, error: RowError | None) -> dict[str, Any]:
    """One entry of a record's ``turns``: the message's index and role, and its verdict (or its error)."""
    out: dict[str, Any] = {"index": judged.index, "role": judged.role}
    if prediction is None:
        out["error"] = error.as_dict() if error else None
        return out
    out.update(
        label=prediction.label.value,
        score=prediction.score,
        threshold=prediction.threshold,
        categories=dict(prediction.categories),
        windows=prediction.read.windows,
    )
    if prediction.policy is not None:
        out[POLICY_FIELD] = prediction.policy
    return out


def flatten(record: Mapping[str, Any], *, text_only: bool = False) -> dict[str, Any]:
    """The result's nested values as JSON strings (for CSV and Parquet); ``text_only`` (CSV, whose cells are text):
    a carried column's objects and lists too (Parquet keeps their types)."""
    nested = {
        k
        for k, v in record.items()
        if v is not None and (k in NESTED_FIELDS or text_only and isinstance(v, dict | list))
    }
    return {k: (json.dumps(v, ensure_ascii=False) if k in nested else v) for k, v in record.items()}


def unflatten(record: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`flatten`."""
    return {k: (json.loads(v) if k in NESTED_FIELDS and isinstance(v, str) and v else v) for k, v in record.items()}


def score_rows(
    classifier: Any,
    rows: Sequence[Row],
    columns: Columns,
    *,
    threshold: float | None = None,
    explain: bool = False,
    explain_history: bool = False,
    explain_method: Method = "shapley",
    limits: Limits | None = None,
    policy: Policy | None = None,
) -> list[dict[str, Any]]:
    """Output records for ``rows`` (in order): one ``predict`` call for all scorable rows, decided
    under the operator ``policy`` when one is given (then the records have a ``policy`` field).

    The engines (local and Ray) share this; with ``explain`` the occlusions of all rows run in
    the same call (:func:`dialogue_safety.core.explain.explain`). A row whose utterance needs more
    windows than ``limits.max_windows`` gets the API's ``too_many_windows`` error (the classifier
    reads at most that many: build it with ``max_windows=limits.max_windows``).
    """
    good = [i for i, r in enumerate(rows) if r.example is not None]
    examples = [r.example for r in rows if r.example is not None]
    predictions: dict[int, Prediction] = {}
    explanations: dict[int, dict[str, Any]] = {}
    turn_records = _score_turns(classifier, rows, columns, threshold, limits or Limits(), policy)
    if examples:
        if explain:
            from dialogue_safety.core.explain import explain as explain_examples

            for i, (p, e) in zip(
                good,
                explain_examples(
                    classifier, examples, history=explain_history, threshold=threshold, method=explain_method
                ),
                strict=True,
            ):
                predictions[i], explanations[i] = p, e
        else:
            predictions = dict(zip(good, classifier.predict(examples, threshold), strict=True))
    rows = list(rows)
    for i, prediction in list(predictions.items()):
        try:
            (limits or Limits()).check_read(prediction.read)
        except InvalidInput as exc:
            where = rows[i].where
            message = f"{where}: {exc.message}" if where else exc.message
            rows[i] = Row(where, rows[i].raw, None, RowError(exc.code, message, exc.field))
            del predictions[i]
            explanations.pop(i, None)
    if policy is not None:
        for i, prediction in predictions.items():
            example = rows[i].example
            assert example is not None
            predictions[i] = policy.apply(example, prediction, classifier.card)
    return [
        output_record(
            r,
            columns,
            predictions.get(i),
            explanations.get(i),
            explain=explain,
            policy=policy is not None,
            turns=turn_records.get(i),
        )
        for i, r in enumerate(rows)
    ]


def _score_turns(
    classifier: Any,
    rows: Sequence[Row],
    columns: Columns,
    threshold: float | None,
    limits: Limits,
    policy: Policy | None,
) -> dict[int, list[dict[str, Any]]]:
    """Per row with ``turns`` (every_turn), its turn records: every judged message of every row in one
    ``predict`` call (under ``policy`` when one is given; a message refused by the window cap gets its error)."""
    judged = [(i, one) for i, r in enumerate(rows) if r.turns for one in r.turns]
    out: dict[int, list[dict[str, Any]]] = {i: [] for i, r in enumerate(rows) if r.turns}
    if not judged:
        return out
    predictions = classifier.predict([one.example for _, one in judged], threshold)
    for (i, one), prediction in zip(judged, predictions, strict=True):
        try:
            limits.check_read(prediction.read)
        except InvalidInput as exc:
            field = one.message_field(exc.field, where=columns.messages or "messages")
            out[i].append(turn_record(one, None, RowError(exc.code, exc.message, field)))
            continue
        if policy is not None:
            prediction = policy.apply(one.example, prediction, classifier.card)
        out[i].append(turn_record(one, prediction, None))
    return out


def count_errors(records: Iterable[Mapping[str, Any]]) -> int:
    return sum(1 for r in records if r.get("error") is not None)
