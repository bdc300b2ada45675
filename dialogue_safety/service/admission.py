"""Admission: one rule, at one door, that needs no measurement to be right.

A request is charged its real work, known from its encoding before it is queued: the tokens the
model reads for it (:attr:`dialogue_safety.core.encoding.EncodedExample.tokens`: every window of a
long utterance, and both passes of a decomposed model's item with history; an explanation is
every sequence it scores). Work is charged to one of two lanes, each with its own budget, a
setting: ``classify`` (``max_pending_tokens``) and ``explain`` (``max_explain_tokens``), so that
explanations, dozens of sequences each, never take the classification lane. A lane holds the
work admitted to it and not yet answered (waiting and running); its charge is released item by
item as answers are made, or as soon as the caller hangs up.

:meth:`AdmissionGate.admit` admits a request when all of this holds, else refuses it:

* its cost is at most half its lane's budget (``max_request_tokens``); above: 413, naming the
  limit (a request that could never fit is refused for good, not retried). Before the request is
  tokenised, what it costs at least is known from its characters
  (:meth:`dialogue_safety.core.limits.CostBound.at_least`: a token per word, a row's [CLS] and [SEP]s
  per window the tokens need at least, never above the real cost): above the limit, 413 at once, so a
  request surely too costly costs no tokenisation. Any other request is tokenised (off the event loop)
  and decided on its real cost, as it is charged: one that only might cost too much by its characters
  (:class:`dialogue_safety.core.limits.CostBound`'s upper bound) is never refused for it;
* its lane's charge plus its cost fits the lane's budget; else 429 with ``Retry-After``;
* its client's charge in that lane plus its cost fits the client's fair share: the budget
  divided by the number of clients holding work in the lane (itself counted), at least two.
  So one client alone holds at most half a lane and a newcomer always finds room; as more
  clients come, each is held to an equal share while the others drain. Else 429.

A client is the caller's address for the HTTP API (one API key serves every client, so it names
none), a player for the break-it game. :meth:`AdmissionGate.refusal` is the same rule for a
request whose cost is not known yet (one more token), cheap enough to answer from the request
head (:class:`EarlyRefusalMiddleware`), with the 413 of what a request costs at least, before it is tokenised.
The rule is called from one place, :meth:`dialogue_safety.service.batcher.MicroBatcher.admission`: before a
request's body is read (through :meth:`dialogue_safety.service.state.ServiceState.early_refusal`), before it is
tokenised, and once, to charge it, when it is encoded (both in
:meth:`dialogue_safety.service.batcher.MicroBatcher.enqueue`, inside the service's one door to the model,
:meth:`dialogue_safety.service.state.ServiceState.score`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from dialogue_safety.core.errors import ServiceError
from dialogue_safety.service.errors import Overloaded, RequestTooCostly, error_response

LaneName = Literal["classify", "explain"]
CLASSIFY: LaneName = "classify"
EXPLAIN: LaneName = "explain"
SETTING = {CLASSIFY: "SAFETY_MAX_PENDING_TOKENS", EXPLAIN: "SAFETY_MAX_EXPLAIN_TOKENS"}


class AdmissionObserver(Protocol):
    """What the gate reports (implemented by :class:`dialogue_safety.service.telemetry.ServiceMetrics`)."""

    def observe_charged(self, lane: str, tokens: int) -> None: ...
    def observe_admitted(self, lane: str, cost: int) -> None: ...
    def observe_refused(self, lane: str, reason: str) -> None: ...


@dataclass
class Lane:
    """One budget and what is charged to it, in total and per client."""

    name: LaneName
    budget: int
    charged: int = 0
    clients: dict[str, int] = field(default_factory=dict)

    @property
    def max_request_tokens(self) -> int:
        """The most one request may cost: half the budget (a fair share when two clients hold work)."""
        return max(1, self.budget // 2)

    def fair_share(self, client: str) -> int:
        """What ``client`` may hold: the budget over the clients holding work (it counted), at least two."""
        holders = len(self.clients) + (client not in self.clients)
        return self.budget // max(2, holders)


class Charge:
    """What one admitted request holds in its lane; released item by item (:meth:`release`)."""

    __slots__ = ("_gate", "_lane", "client", "left")

    def __init__(self, gate: AdmissionGate, lane: Lane, client: str, cost: int) -> None:
        self._gate, self._lane, self.client, self.left = gate, lane, client, cost

    def release(self, tokens: int) -> None:
        """Give back ``tokens`` of this charge (an item answered, dropped or failed); never more than is left."""
        tokens = min(tokens, self.left)
        if tokens <= 0:
            return
        self.left -= tokens
        self._gate._release(self._lane, self.client, tokens)


class AdmissionGate:
    """The two lanes and the rule above. One per service (it outlives a hot swap: the old model's
    work still holds the machine while it drains)."""

    def __init__(
        self,
        max_pending_tokens: int,
        max_explain_tokens: int,
        *,
        retry_after_s: int = 1,
        observer: AdmissionObserver | None = None,
    ) -> None:
        self.lanes = {CLASSIFY: Lane(CLASSIFY, max_pending_tokens), EXPLAIN: Lane(EXPLAIN, max_explain_tokens)}
        self.retry_after_s = retry_after_s
        self._observer = observer

    def lane(self, name: LaneName) -> Lane:
        return self.lanes[name]

    def refusal(self, client: str, lane: LaneName = CLASSIFY, at_least: int | None = None) -> ServiceError | None:
        """The refusal a request of ``client`` gets before its cost is known, or None: 413 when ``at_least``
        (what it costs at least: :meth:`dialogue_safety.core.limits.CostBound.at_least` from its characters, or
        an explanation's two sequences; None: not known) is more than one request may cost, else 429 when its
        lane or its share is full even for one more token."""
        if at_least is not None and at_least > self.lanes[lane].max_request_tokens:
            return self._too_costly(lane, at_least, bounded=True)
        return self._refusal(self.lanes[lane], client, 1)

    def admit(self, client: str, lane: LaneName, cost: int) -> Charge:
        """Charge ``cost`` tokens to ``client`` in ``lane``, or raise the refusal (413 or 429)."""
        chosen = self.lanes[lane]
        refusal: ServiceError | None = None
        if cost > chosen.max_request_tokens:
            refusal = self._too_costly(lane, cost)
        else:
            refusal = self._refusal(chosen, client, cost)
        if refusal is not None:
            raise refusal
        chosen.charged += cost
        chosen.clients[client] = chosen.clients.get(client, 0) + cost
        if self._observer is not None:
            self._observer.observe_admitted(lane, cost)
            self._observer.observe_charged(lane, chosen.charged)
        return Charge(self, chosen, client, cost)

    def _too_costly(self, lane: LaneName, cost: int, *, bounded: bool = False) -> RequestTooCostly:
        """The 413 of a request costing ``cost`` (``bounded``: at least that much, by its characters)."""
        chosen = self.lanes[lane]
        if self._observer is not None:
            self._observer.observe_refused(lane, "too_costly")
        what = "explanation" if lane == EXPLAIN else "request"
        fix = "explain a shorter text" if lane == EXPLAIN else "send fewer or shorter items per request"
        if not bounded:
            costs = f"costs {cost} model tokens (tokens x windows x passes)"
        elif lane == EXPLAIN:
            costs = f"costs at least {cost} model tokens (two sequences of its text, tokens x windows x passes)"
        else:
            costs = (
                f"costs at least {cost} model tokens by its characters (tokens x windows x passes; a token per "
                "word at least)"
            )
        return RequestTooCostly(
            f"this {what} {costs}; one {what} may cost at most {chosen.max_request_tokens}, half of "
            f"{SETTING[lane]} ({chosen.budget}): {fix}"
        )

    def _refusal(self, chosen: Lane, client: str, cost: int) -> Overloaded | None:
        if chosen.charged + cost > chosen.budget:
            reason = "busy"
            message = (
                f"the {chosen.name} lane holds {chosen.charged} of its {chosen.budget} model tokens of work "
                f"({SETTING[chosen.name]}); this request needs {cost}: retry later"
            )
        elif chosen.clients.get(client, 0) + cost > chosen.fair_share(client):
            reason = "fair_share"
            message = (
                f"this client holds {chosen.clients.get(client, 0)} model tokens of work in the {chosen.name} lane; "
                f"with {cost} more it would pass its fair share ({chosen.fair_share(client)}: "
                f"{SETTING[chosen.name]} over the clients holding work, at least two): retry when its requests "
                "are answered"
            )
        else:
            return None
        if self._observer is not None:
            self._observer.observe_refused(chosen.name, reason)
        return Overloaded(message, retry_after_s=self.retry_after_s)

    def _release(self, chosen: Lane, client: str, tokens: int) -> None:
        chosen.charged -= tokens
        held = chosen.clients.get(client, 0) - tokens
        if held > 0:
            chosen.clients[client] = held
        else:
            chosen.clients.pop(client, None)
        if self._observer is not None:
            self._observer.observe_charged(chosen.name, chosen.charged)

    def describe(self) -> dict[str, object]:
        """The budgets, limits and charges now (``GET /v1/model``)."""
        return {
            "unit": "model tokens: tokens x windows x passes of every sequence a request scores",
            "fair_share": "a lane's budget over the clients holding work in it (at least two)",
            **{
                name: {
                    "budget_tokens": lane.budget,
                    "max_request_tokens": lane.max_request_tokens,
                    "charged_tokens": lane.charged,
                    "clients": len(lane.clients),
                }
                for name, lane in self.lanes.items()
            },
        }


def http_client(scope: Mapping[str, Any]) -> str:
    """The client an HTTP request is charged to: its peer address (behind a reverse proxy, the proxy's,
    unless the server is told to trust its forwarding headers)."""
    peer = scope.get("client")
    return f"address:{peer[0]}" if peer else "address:unknown"


class EarlyRefusalMiddleware:
    """Answer the refusal ``refusal(scope)`` gives (the service's
    :meth:`dialogue_safety.service.state.ServiceState.early_refusal`: the 429 of the rule above for one more
    token of work from the request's client) before the request's body is read or parsed: the one early-refusal
    entry point, portable to any ASGI server.

    Under overload most requests are refused: a refusal must cost far less than an answer, or refusing alone
    takes the CPU that the accepted requests need. The connection stays open (the unread body is skipped).
    """

    def __init__(self, app: ASGIApp, refusal: Callable[[Scope], ServiceError | None]) -> None:
        self.app = app
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:  # counted under its route (a fixed path: RequestMetricsMiddleware)
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)
