"""``POST /admin/policy``: reload the operator policy (:mod:`dialogue_safety.core.policy`) without a restart.

The new file is read and checked (syntax, rules, the served model's heads) beside the policy in
force; a bad one is refused (422 ``policy_refused``, naming file, line and problem) and the old
policy stays. A good one replaces the old in one assignment: a :class:`Policy` is immutable, so
a request in flight is decided under one policy or the other, never a mix, and none is dropped.
Like the other admin endpoints it needs the API key (refused outright when none is configured).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.policy import PolicyError, load_policy
from dialogue_safety.service.auth import ADMIN_PREFIX

log = logging.getLogger("dialogue_safety.service.policy_admin")


class PolicyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(None, description="the policy file to use (default: reload the file in force)")


class PolicyResult(BaseModel):
    policy: dict[str, Any] = Field(description="the policy now in force, as GET /v1/model shows it")
    previous: str | None = Field(description="the file name of the policy in force before (null: none)")


router = APIRouter(prefix=ADMIN_PREFIX, tags=["admin"])


@router.post("/policy", response_model=PolicyResult, summary="Reload the operator policy (refused if it is invalid)")
async def reload_policy(request: Request, body: PolicyRequest | None = None) -> PolicyResult:
    state = request.app.state.safety
    current = state.policy
    path = (body.path if body is not None else None) or (current.source if current is not None else None)
    path = path or (str(state.settings.policy) if state.settings.policy is not None else None)
    if path is None:
        raise InvalidInput(
            "no policy file to reload: send {'path': ...} or start the service with SAFETY_POLICY / --policy",
            code="policy_refused",
            field="path",
        )
    served = state.served
    try:
        policy = load_policy(path, served.card.heads if served is not None and served.card is not None else None)
    except PolicyError as exc:
        log.error("policy refused, the policy in force stays: %s", exc)
        where = Path(exc.path).name + (f":{exc.line}" if exc.line is not None else "")  # no local path in answers
        raise InvalidInput(
            f"policy refused, the policy in force stays: {where}: {exc.problem}", code="policy_refused", field="path"
        ) from None
    state.policy = policy  # one assignment: each request sees the old policy or the new one
    log.info("policy reloaded from %s", path)
    return PolicyResult(
        policy=policy.describe(), previous=current.describe()["source"] if current is not None else None
    )
