"""A small client of the HTTP service: :func:`dialogue_safety.classify` and ``classify_batch`` over HTTP.

    client = dialogue_safety.Client("http://localhost:8000", api_key="...")
    client.classify("so what", history=["I lost my job today"])          # -> Prediction
    client.classify(messages=[{"role": "user", "content": "hi"}, ...])   # chat messages: the last one judged
    client.classify_batch(["you are a clown", Example.from_texts("ok", ["hi"])])
    client.classify_conversation(messages, roles=["assistant"])         # every turn judged, in one request

It returns the same :class:`~dialogue_safety.core.schema.Prediction` objects as the local API (with
``policy`` when an operator rule decided), and retries a request the service refuses for now
(429 overloaded, 503 not ready yet) after the ``Retry-After`` the service sends, at most
``retries`` times. Any other error raises :class:`ClientError` with the service's ``status``,
``code``, ``message`` and ``field``. Standard library only (``urllib``): installing the package
without extras is enough to call a service.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dialogue_safety.core.errors import ServiceError
from dialogue_safety.core.messages import TurnPrediction
from dialogue_safety.core.schema import Example, Label, Prediction, Reading, Turn, history_list

RETRIED_STATUSES = frozenset({429, 503})  # "not now": the service says when to come back (Retry-After)


class ClientError(ServiceError):
    """An error answer of the service (``status``: the HTTP status; 0: no answer at all)."""

    def __init__(self, status: int, message: str, *, code: str | None = None, field: str | None = None) -> None:
        super().__init__(message, code=code, field=field)
        self.status = status


def _turn(turn: str | Turn | Mapping[str, Any]) -> Any:
    if isinstance(turn, Turn):
        return {"speaker": turn.speaker, "text": turn.text}
    return dict(turn) if isinstance(turn, Mapping) else turn


def _item(dialogue: Example | str) -> Any:
    if isinstance(dialogue, str):
        return dialogue
    return {"history": _history(dialogue.history), "utterance": dialogue.utterance}


def _supported(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _history(history: Sequence[str | Turn | Mapping[str, Any]]) -> list[Any]:
    return [_turn(t) for t in history_list(history)]


def prediction_from_answer(answer: Mapping[str, Any]) -> Prediction:
    """The :class:`Prediction` a ``/v1/classify`` result describes."""
    truncated = answer.get("truncated") or {}
    read = Reading(
        windows=int(answer.get("windows", 1)),
        windows_needed=int(answer.get("windows", 1)),
        utterance_chars_unread=int(truncated.get("utterance_chars_unread", 0)),
        history_turns_dropped=int(truncated.get("history_turns_dropped", 0)),
        language=answer.get("language"),
        language_supported=_supported(answer.get("language_supported", True)),  # null: cannot tell
    )
    return Prediction(
        score=float(answer["score"]),
        label=Label(answer["label"]),
        threshold=float(answer["threshold"]),
        categories=dict(answer.get("categories") or {}),
        read=read,
        policy=answer.get("policy"),
    )


class Client:
    """Calls a running service; ``api_key``: the service's ``SAFETY_API_KEY`` (sent as a bearer token)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 3,
        max_retry_wait_s: float = 30.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.retries = retries
        self.max_retry_wait_s = max_retry_wait_s

    def classify(
        self,
        utterance: str | None = None,
        history: Sequence[str | Turn] = (),
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        include_system: bool = False,
        threshold: float | None = None,
    ) -> Prediction:
        """The prediction for ``utterance`` after ``history``, or for the last of chat ``messages``."""
        body: dict[str, Any] = {}
        if messages is not None:
            if utterance is not None or history:
                raise TypeError("pass either utterance (and history) or messages, not both")
            body.update(messages=list(messages), include_system=include_system)
        elif utterance is None:
            raise TypeError("classify() needs the utterance to judge (or chat messages=[...])")
        else:
            body.update(history=_history(history), utterance=utterance)
        if threshold is not None:
            body["threshold"] = threshold
        return prediction_from_answer(self.post("/v1/classify", body))

    def classify_batch(self, dialogues: Iterable[Example | str], *, threshold: float | None = None) -> list[Prediction]:
        """One prediction per dialogue, in order (one request; an item the service refuses raises
        :class:`ClientError` naming it, as the whole batch is refused then)."""
        body: dict[str, Any] = {"items": [_item(d) for d in dialogues], "item_errors": "fail"}
        if threshold is not None:
            body["threshold"] = threshold
        return [prediction_from_answer(r) for r in self.post("/v1/classify/batch", body)["results"]]

    def classify_conversation(
        self,
        conversation: Sequence[Mapping[str, Any] | str | Turn],
        *,
        roles: Sequence[str] | None = None,
        include_system: bool = False,
        threshold: float | None = None,
    ) -> list[TurnPrediction]:
        """A verdict for every turn of ``conversation`` (chat messages, or turns: texts or :class:`Turn`), each
        given the turns before it, in one request (``/v1/classify/conversation``), as
        :func:`dialogue_safety.classify_conversation` answers locally."""
        body: dict[str, Any] = {}
        messages = [dict(m) for m in conversation if isinstance(m, Mapping) and "role" in m]
        if conversation and len(messages) == len(conversation):
            body.update(messages=messages, include_system=include_system)
        elif messages:  # some chat messages, some not: name the first that is not one
            i = next(i for i, m in enumerate(conversation) if not (isinstance(m, Mapping) and "role" in m))
            raise TypeError(f"conversation[{i}] is not a chat message with a role, as the others are")
        else:
            body["turns"] = _history(conversation)
        if roles is not None:
            body["roles"] = list(roles)
        if threshold is not None:
            body["threshold"] = threshold
        answer = self.post("/v1/classify/conversation", body)
        return [TurnPrediction(r["index"], r["role"], prediction_from_answer(r)) for r in answer["results"]]

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        """POST ``body`` as JSON to ``path`` and return the JSON answer (retrying 429 and 503)."""
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    raw = response.read()
                    status = response.status
            except urllib.error.HTTPError as exc:
                wait = _retry_after(exc.headers.get("Retry-After"))
                if exc.code in RETRIED_STATUSES and wait is not None and attempt < self.retries:
                    exc.close()
                    time.sleep(min(wait, self.max_retry_wait_s))
                    continue
                raise _client_error(exc) from None
            except urllib.error.URLError as exc:
                raise ClientError(0, f"cannot reach {self.base_url}: {exc.reason}", code="unreachable") from None
            except (OSError, http.client.HTTPException) as exc:  # timed out, hung up, cut short
                raise ClientError(
                    0, f"no whole answer from {self.base_url}{path}: {type(exc).__name__}: {exc}", code="unreachable"
                ) from None
            try:
                return json.loads(raw)
            except ValueError:
                raise ClientError(
                    status, f"the answer of {self.base_url}{path} is not JSON (a proxy's page?)", code="bad_response"
                ) from None
        raise AssertionError("unreachable")  # the last attempt returns or raises


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (the service sends seconds); None when absent or unreadable."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _client_error(exc: urllib.error.HTTPError) -> ClientError:
    try:
        error = json.loads(exc.read()).get("error") or {}
    except (ValueError, AttributeError, OSError, http.client.HTTPException):
        error = {}
    finally:
        exc.close()
    if not isinstance(error, Mapping):  # {"error": "nope"}: a message, not the service's shape
        error = {"message": str(error)}
    message = str(error.get("message") or exc.reason)
    return ClientError(exc.code, message, code=error.get("code"), field=error.get("field"))
