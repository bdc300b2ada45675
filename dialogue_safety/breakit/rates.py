"""The players' rate limits: per player token and per client address, per action, per round.

Built on the ``limits`` library (moving windows in process memory: one service process serves a
round; a restart forgets the windows). Each action has limits for the player's token and for the
client address (players behind one NAT share the address, so its limits are wider); a request is
refused with :class:`dialogue_safety.core.errors.RateLimited` (429 with ``Retry-After``) as soon
as one of them is spent. The defaults are for people typing (:data:`DEFAULT_RATES`); a round may
override any of them (``dialogue-safety break-it new-round/configure --rate ACTION:SCOPE=LIMITS``),
in the ``limits`` notation ("10/minute", "2/second;60/minute").
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dialogue_safety.core.errors import InvalidInput, RateLimited

if TYPE_CHECKING:  # `limits` comes with the breakit extra: imported where a round is played, not at import
    from limits import RateLimitItem

ACTIONS = ("register", "task", "score", "try", "validate")
SCOPES = ("player", "address")
#: per action and scope; sign-up has no player yet. Typing and reading speed, with room for bursts:
#: the page asks for a live score a moment after the last keystroke.
DEFAULT_RATES: dict[str, dict[str, str]] = {
    "register": {"address": "5/minute;20/hour"},
    "task": {"player": "10/minute;200/hour", "address": "60/minute"},  # each one a row and a context drawn
    "score": {"player": "3/second;60/minute", "address": "10/second;300/minute"},
    "try": {"player": "6/minute;120/hour", "address": "30/minute"},
    "validate": {"player": "20/minute", "address": "60/minute"},
}


def parse_rates(overrides: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    """The defaults with a round's overrides (``{"try": {"player": "10/minute"}}``), checked."""
    rates = {action: dict(scopes) for action, scopes in DEFAULT_RATES.items()}
    for action, scopes in (overrides or {}).items():
        if action not in ACTIONS or not isinstance(scopes, Mapping):
            raise InvalidInput(f"rates: unknown action {action!r}; expected one of {ACTIONS}", field="rates")
        for scope, value in scopes.items():
            if scope not in SCOPES or (action == "register" and scope == "player"):
                raise InvalidInput(f"rates.{action}: unknown scope {scope!r}; expected one of {SCOPES}", field="rates")
            from limits import parse_many

            try:
                parse_many(str(value))
            except ValueError:
                raise InvalidInput(
                    f"rates.{action}.{scope}: {value!r} is not a rate such as '10/minute' or '2/second;60/minute'",
                    field="rates",
                ) from None
            rates[action][scope] = str(value)
    return rates


def parse_rate_option(items: list[str]) -> dict[str, dict[str, str]]:
    """``["try:player=10/minute", ...]`` (the command line's ``--rate``) as round overrides."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        target, sep, value = item.partition("=")
        action, colon, scope = target.partition(":")
        if not sep or not colon or not value:
            raise ValueError(f"--rate {item!r}: expected ACTION:SCOPE=LIMITS, e.g. try:player=10/minute")
        out.setdefault(action.strip(), {})[scope.strip()] = value.strip()
    parse_rates(out)
    return out


class RateLimits:
    """One process's windows for every round, action, scope and key."""

    def __init__(self) -> None:
        from limits.storage import MemoryStorage
        from limits.strategies import MovingWindowRateLimiter

        self.limiter = MovingWindowRateLimiter(MemoryStorage())
        self._parsed: dict[str, list[RateLimitItem]] = {}

    def _items(self, text: str) -> list[RateLimitItem]:
        if text not in self._parsed:
            from limits import parse_many

            self._parsed[text] = list(parse_many(text))
        return self._parsed[text]

    def hit(
        self,
        round_number: int,
        overrides: Mapping[str, Any] | None,
        action: str,
        *,
        player: str | None = None,
        address: str | None = None,
    ) -> None:
        """Count one ``action`` for the player (a stable id, not the token) and the address, or
        raise :class:`RateLimited` without counting it when a limit is spent."""
        rates = parse_rates(overrides)[action]
        checks = [
            (scope, item, (str(round_number), action, scope, key))
            for scope, key in (("player", player), ("address", address))
            if key is not None and scope in rates
            for item in self._items(rates[scope])
        ]
        for scope, item, keys in checks:
            if not self.limiter.test(item, *keys):
                reset, _remaining = self.limiter.get_window_stats(item, *keys)
                retry = max(1, math.ceil(reset - time.time()))
                who = "this player" if scope == "player" else "this address"
                raise RateLimited(
                    f"too many {action} requests from {who} (at most {item}); retry in {retry} s",
                    retry_after_s=retry,
                )
        for _scope, item, keys in checks:
            self.limiter.hit(item, *keys)
