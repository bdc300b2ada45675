"""Hot swap: serve a new model directory without dropping or failing the requests in flight.

Two triggers, one path (:meth:`ModelSwapper.swap`):

* ``POST /admin/model {"model_dir": "..."}`` with the API key (the admin endpoint is refused
  when no ``SAFETY_API_KEY`` is configured; :mod:`dialogue_safety.service.auth` checks both);
* ``SIGHUP``: reload the model directory in force (point a symlink at the new directory, then
  ``kill -HUP``).

The new directory is checked, loaded, warmed up and probed *beside* the old model; anything
wrong (no card, no ONNX file, a graph that does not load, a probe score that is not a
probability) refuses the swap and the old model keeps serving. Once it passes, the service
switches to it in one step (new requests go to the new model's batcher) and the old batcher
is drained: what was queued there finishes on the old model and is answered with the old
model's id and threshold (:class:`dialogue_safety.service.state.ServedModel`). Once its last request
is answered, the old model is released: its session, threads and memory are freed before the swap
answers (:func:`dialogue_safety.service.memory.collect_replaced`; ``released`` says whether they
were). ``/v1/model`` and the ``safety_model_info`` metric show the new version;
``safety_model_swaps{outcome}`` counts swaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Request
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from dialogue_safety.core.errors import InvalidInput
from dialogue_safety.core.schema import Example
from dialogue_safety.service.auth import ADMIN_PREFIX
from dialogue_safety.service.log_values import UNSAFE_CHARACTERS, printable
from dialogue_safety.service.memory import collect_replaced

if TYPE_CHECKING:
    from dialogue_safety.service.state import Classifier, ServiceState

log = logging.getLogger("dialogue_safety.service.hot_swap")
DRAIN_TIMEOUT_S = 60.0  # the old model finishes its queued requests within this, or they fail (503)
# when the replaced model is looked for again after its batcher drained: a request it answered may
# still be writing its response (and holds the model until then)
RELEASE_CHECKS_S = (0.0, 0.05, 0.25, 1.0, 4.0)
PROBE = Example.from_texts("thanks, that helps a lot", ["can you recommend a book?"])


MAX_PATH_BYTES = 4096  # Linux's PATH_MAX: a longer path cannot name a file
MAX_NAME_BYTES = 255  # NAME_MAX: the longest file or directory name of the common file systems
# the answer to every refused swap: why (no such directory, no card, a graph that does not load...) goes
# to the server log only, so that the answer tells nothing about the server's file system
REFUSED = (
    "model refused, the current model keeps serving: the directory does not exist, is not an exported model "
    "directory, or its model does not load or fails the probe (the server log says which)"
)


def plain_path(value: str, what: str = "the model directory") -> str:
    """``value``, a path the file system could hold, checked before it is used (ValueError saying what is
    wrong; the value is never echoed). The admin endpoints that take a path (this one, the policy reload)
    check it here."""
    if not value.strip():
        raise ValueError(f"the path is empty: send {what}'s path")
    if UNSAFE_CHARACTERS.search(value):
        raise ValueError("the path holds a control character or a lone surrogate: send a plain path")
    if len(value.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"the path is longer than {MAX_PATH_BYTES} bytes")
    if any(len(part.encode()) > MAX_NAME_BYTES for part in value.split("/")):
        raise ValueError(f"a part of the path is longer than {MAX_NAME_BYTES} bytes")
    return value


class SwapRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model_dir: str | None = Field(None, description="the model directory to serve (default: reload the current one)")

    @field_validator("model_dir")
    @classmethod
    def _a_plain_path(cls, value: str | None) -> str | None:
        return None if value is None else plain_path(value)


class SwapResult(BaseModel):
    model: str = Field(description="<name>@<version> now served")
    previous: str = Field(description="<name>@<version> served before")
    model_dir: str = Field(description="the name of the model directory now served (its path stays in the server log)")
    drained: bool = Field(description="every request queued on the previous model finished on it")
    released: bool = Field(
        description="the previous model's session, threads and memory were freed (false: still referenced; logged)"
    )


def _check_probe(classifier: Classifier) -> None:
    predictions = classifier.predict_encoded(classifier.encode([PROBE]))
    if len(predictions) != 1:
        raise ValueError(f"the probe returned {len(predictions)} predictions for 1 example")
    score = predictions[0].score
    if not (isinstance(score, float) and math.isfinite(score) and 0.0 <= score <= 1.0):
        raise ValueError(f"the probe score {score!r} is not a probability")


class ModelSwapper:
    """One swap at a time; a refused swap changes nothing."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self._lock = asyncio.Lock()
        self.swaps = Counter(
            "safety_model_swaps",
            "hot swaps of the served model by outcome",
            ["outcome"],
            registry=state.metrics.registry,
        )

    async def swap(self, model_dir: str | Path | None = None) -> SwapResult:
        """Serve ``model_dir`` (default: the current model directory, re-read) or raise InvalidInput."""
        from dialogue_safety.core.model_dir import model_dir_problem  # the one check of a model directory's layout

        async with self._lock:
            state = self.state
            target = Path(model_dir) if model_dir is not None else state.settings.model_dir
            try:
                problem = model_dir_problem(target)
            except (OSError, ValueError) as exc:  # a path the file system refuses to look at
                problem = f"{target} cannot be read: {type(exc).__name__}: {exc}"
            settings = state.settings.model_copy(update={"model_dir": target})
            classifier = None
            if problem is None:
                try:
                    classifier = await state.load_classifier(settings)
                    await asyncio.to_thread(_check_probe, classifier)
                except Exception as exc:  # noqa: BLE001  (any failure refuses the swap)
                    problem = f"{target} does not load: {type(exc).__name__}: {exc}"
            if problem is not None or classifier is None:
                if classifier is not None:  # loaded, then failed its probe: freed now, not at some later collection
                    classifier = None
                    collect_replaced()
                self.swaps.labels(outcome="refused").inc()
                log.error("hot swap refused, %s keeps serving: %s", state.model_id or "nothing", printable(problem))
                raise InvalidInput(REFUSED, code="model_refused", field="model_dir")
            previous_id = state.model_id
            replaced = None if state.classifier is None else weakref.ref(state.classifier)
            old = await state.install(classifier, settings)
            drained = True if old is None else await state.retire(old, DRAIN_TIMEOUT_S)
            del old, classifier  # the swap itself holds neither model from here on
            released = replaced is None or await _release(replaced)
            self.swaps.labels(outcome="swapped").inc()
            log.info(
                "hot swap: %s -> %s from %s (drained: %s, released: %s)",
                previous_id,
                state.model_id,
                printable(target),
                drained,
                released,
            )
            return SwapResult(
                model=state.model_id,
                previous=previous_id,
                model_dir=target.name,  # no local path in an answer
                drained=drained,
                released=released,
            )

    def install_sighup(self) -> bool:
        """Reload the current model directory on SIGHUP (only possible in the main thread's loop)."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        except (RuntimeError, ValueError, NotImplementedError, AttributeError):
            log.debug("SIGHUP reload not installed (not the main thread, or no SIGHUP on this platform)")
            return False
        return True

    def remove_sighup(self) -> None:
        with contextlib.suppress(RuntimeError, ValueError, NotImplementedError, AttributeError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    def _on_sighup(self) -> None:
        log.info("SIGHUP: reloading %s", printable(self.state.settings.model_dir))
        task = asyncio.ensure_future(self.swap())
        task.add_done_callback(_log_failure)


async def _release(replaced: weakref.ref[Any]) -> bool:
    """Free the replaced classifier once nothing holds it (True), checking again while the last
    requests it answered finish; False (logged) if something still holds it after the last check."""
    for wait_s in RELEASE_CHECKS_S:
        await asyncio.sleep(wait_s)
        collect_replaced()
        if replaced() is None:
            return True
    log.warning("hot swap: the replaced model is still referenced; its memory is not freed")
    return False


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("SIGHUP reload failed: %s", task.exception())


def swapper_of(request: Request) -> ModelSwapper:
    """The app's swapper (``app.state.swapper``, set by :func:`dialogue_safety.service.app.create_app`)."""
    swapper: ModelSwapper = request.app.state.swapper
    return swapper


#: ``POST /admin/model``: needs the API key; refused outright when none is configured (both decided by
#: :class:`dialogue_safety.service.auth.ApiKeyMiddleware`, before the body is read). The app mounts it
#: with the key's OpenAPI declaration and the error responses.
admin_router = APIRouter(prefix=ADMIN_PREFIX, tags=["admin"])


@admin_router.post(
    "/model", response_model=SwapResult, summary="Hot-swap the served model (refused if it does not load)"
)
async def swap_model(body: SwapRequest, swapper: Annotated[ModelSwapper, Depends(swapper_of)]) -> SwapResult:
    return await swapper.swap(body.model_dir)
