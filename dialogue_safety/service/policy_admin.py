"""``POST /admin/policy``: reload the operator policy (:mod:`dialogue_safety.core.policy`) without a restart.

The new file is read and checked (syntax, rules, the served model's heads) beside the policy in
force; a bad one is refused (422 ``policy_refused``, naming file, line and problem) and the old
policy stays. A good one replaces the old in one assignment: a :class:`Policy` is immutable, so
a request in flight is decided under one policy or the other, never a mix, and none is dropped.
Like the other admin endpoints it needs the API key (refused outright when none is configured).

Which files it may read: the start-up policy file (``SAFETY_POLICY``), and the files in the policy
directory (``SAFETY_POLICY_DIR``; a relative path is taken in it), once symbolic links are resolved;
any other path is refused without being opened. The file is read as the policy loader reads every
policy (:func:`dialogue_safety.core.policy.read_policy_file`: a regular file of bounded size, opened
without waiting on a FIFO), off the event loop, as are the parsing, the regexes and the term
automaton. A path with a control character, a NUL byte or a lone surrogate is refused before it is
used; what the client sent is escaped in the log, and no answer quotes a file that is not a policy.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.policy import Policy, PolicyError, load_policy
from dialogue_safety.service.auth import ADMIN_PREFIX
from dialogue_safety.service.hot_swap import plain_path
from dialogue_safety.service.log_values import printable
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import ServiceState, State

log = logging.getLogger("dialogue_safety.service.policy_admin")

NOT_ALLOWED = (
    "this service loads policies only from its start-up policy file (SAFETY_POLICY) or from files in its policy "
    "directory (SAFETY_POLICY_DIR{where})"
)


class PolicyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(
        None,
        description="the policy file to use: the start-up file, or a file in SAFETY_POLICY_DIR (a relative path "
        "is taken there); default: reload the file in force",
    )

    @field_validator("path")
    @classmethod
    def _a_plain_path(cls, value: str | None) -> str | None:
        return None if value is None else plain_path(value, "the policy file")


class PolicyResult(BaseModel):
    policy: dict[str, Any] = Field(description="the policy now in force, as GET /v1/model shows it")
    previous: str | None = Field(description="the file name of the policy in force before (null: none)")


router = APIRouter(prefix=ADMIN_PREFIX, tags=["admin"])


def allowed_policy_path(path: str, settings: ServiceSettings) -> Path | None:
    """``path`` as the file to read when it is one this service may load (the start-up policy file, or a file
    in the policy directory, links resolved), else None. Only names are looked at: nothing is opened."""
    directory = settings.policy_dir
    candidate = Path(path)
    if not candidate.is_absolute() and directory is not None:
        candidate = directory / candidate
    try:
        real = Path(os.path.realpath(candidate))
        if settings.policy is not None and real == Path(os.path.realpath(settings.policy)):
            return real
        if directory is not None and real.is_relative_to(os.path.realpath(directory)):
            return real
    except (OSError, ValueError):
        return None
    return None


def _refuse(message: str) -> InvalidInput:
    return InvalidInput(f"policy refused, the policy in force stays: {message}", code="policy_refused", field="path")


def _load(path: str, heads: list[str] | None, card: Any) -> Policy:
    """Read, check and prepare (term automaton, regexes) the policy at ``path``: in a worker thread."""
    policy = load_policy(path, heads)
    if card is not None:
        policy.prepare(card)
    return policy


@router.post("/policy", response_model=PolicyResult, summary="Reload the operator policy (refused if it is invalid)")
async def reload_policy(state: State, body: PolicyRequest | None = None) -> PolicyResult:
    async with state.policy_reload:  # one reload at a time, from reading the policy in force to replacing it
        return await _reload(state, body)


async def _reload(state: ServiceState, body: PolicyRequest | None) -> PolicyResult:
    settings: ServiceSettings = state.settings
    current = state.policy
    asked = body.path if body is not None else None
    path = asked or (current.source if current is not None else None)
    path = path or (str(settings.policy) if settings.policy is not None else None)
    if path is None:
        raise InvalidInput(
            "no policy file to reload: send {'path': ...} or start the service with SAFETY_POLICY / --policy",
            code="policy_refused",
            field="path",
        )
    target = path
    if asked is not None:
        allowed = allowed_policy_path(asked, settings)
        if allowed is None:
            log.warning("policy refused, the policy in force stays: %s is not an allowed policy file", printable(asked))
            where = "" if settings.policy_dir is not None else ": unset"  # the directory itself is never shown
            raise _refuse(NOT_ALLOWED.format(where=where))
        target = str(allowed)  # the file the check found, links resolved
    served = state.served
    card = served.card if served is not None else None
    try:
        policy = await asyncio.to_thread(_load, target, card.heads if card is not None else None, card)
    except PolicyError as exc:
        log.error("policy refused, the policy in force stays: %s", printable(exc))
        where = Path(exc.path).name + (f":{exc.line}" if exc.line is not None else "")  # no local path in answers
        raise _refuse(f"{where}: {exc.problem}") from None
    state.policy = policy  # one assignment: each request sees the old policy or the new one
    log.info("policy reloaded from %s", printable(target))
    return PolicyResult(
        policy=policy.describe(), previous=current.describe()["source"] if current is not None else None
    )
