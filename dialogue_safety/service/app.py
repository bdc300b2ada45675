"""The HTTP API: a thin FastAPI shell over the micro-batcher and the ONNX classifier.

``create_app(settings)`` builds everything (settings, metrics registry, limits, routes); the
lifespan loads and warms up the model in a thread, then starts the batcher: ``/health``
answers at once, ``/ready`` and ``/v1/*`` answer 503 until the model is warm. Errors go
through the one table in :mod:`dialogue_safety.service.errors`. The schemas are
:mod:`dialogue_safety.service.schemas`, the routes :mod:`dialogue_safety.service.routes`.

Run it with ``dialogue-safety serve`` or ``uvicorn --factory dialogue_safety.service.app:create_app``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Receive, Scope, Send

from dialogue_safety.breakit import api as breakit_api
from dialogue_safety.service import chat, moderations, policy_admin, routes
from dialogue_safety.service.auth import ApiKeyMiddleware, api_key_declaration, api_key_of, log_auth_state
from dialogue_safety.service.errors import ERROR_RESPONSES, error_response, install_error_handlers
from dialogue_safety.service.hot_swap import ModelSwapper, admin_router
from dialogue_safety.service.json_body import StrictJsonMiddleware
from dialogue_safety.service.limits import BodyGuardMiddleware, apply_to_openapi
from dialogue_safety.service.routes import package_version
from dialogue_safety.service.schemas import REQUEST_FIELDS
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import ClassifierFactory, ServiceState, load_onnx_classifier
from dialogue_safety.service.telemetry import RequestMetricsMiddleware


@dataclass(frozen=True)
class _RouteLabel:
    """What :class:`dialogue_safety.service.telemetry.RequestMetricsMiddleware` reads from ``scope["route"]``."""

    path: str


class EarlyRefusalMiddleware:
    """Answer 429 to ``POST /v1/classify`` and ``/v1/classify/batch`` before their body is read or
    parsed when admission would refuse even one more token of work from their client
    (:meth:`ServiceState.early_refusal`): the one early-refusal entry point, portable to any ASGI server.

    Under overload most requests are refused: a refusal must cost far less than an answer, or
    refusing alone takes the CPU that the accepted requests need. The connection stays open (the
    unread body is skipped).
    """

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.state.early_refusal(scope["method"], scope["path"], scope)
            if refusal is not None:
                scope["route"] = _RouteLabel(scope["path"])  # counted under its route, not "unmatched"
                await error_response(refusal)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    settings: ServiceSettings | None = None,
    *,
    classifier_factory: ClassifierFactory | None = None,
    on_fatal: Callable[[], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """Build the app; ``settings`` default to the ``SAFETY_*`` environment. ``on_fatal`` is called
    (on the event loop) when the model cannot be loaded: the CLI stops the server then; ``on_ready``
    once the first model serves: the CLI settles the heap then (:func:`dialogue_safety.service.memory.settle_heap`)."""
    settings = settings if settings is not None else ServiceSettings()
    state = ServiceState(settings, classifier_factory or load_onnx_classifier, on_fatal, on_ready)
    swapper = ModelSwapper(state)
    game = breakit_api.BreakItGame(state, settings.breakit_db) if settings.breakit_db else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        log_auth_state(settings)
        if game is not None:
            await game.open()  # a database that cannot be opened stops the start-up, loudly
        loader = asyncio.create_task(state.load(), name="safety-model-loader")
        swapper.install_sighup()
        try:
            yield
        finally:
            swapper.remove_sighup()
            loader.cancel()
            await asyncio.gather(loader, return_exceptions=True)
            await state.stop()
            if game is not None:
                game.close()

    # FastAPIOffline: /docs and /redoc load Swagger UI and ReDoc from the app itself
    # (/static-offline-docs), never from a CDN, so they render on air-gapped deployments.
    app = FastAPIOffline(
        title="Dialogue safety classifier",
        summary="Is the last message of this conversation offensive, given what was said before it?",
        description=(
            "`info.version` is the version of the dialogue-safety package (this API); the model has its own "
            "version, named in every answer's `model` field (`<name>@<version>`), in `info.x-model` here and in "
            "`GET /v1/model`."
        ),
        version=package_version(),
        lifespan=lifespan,
        strict_content_type=False,  # a body without Content-Type is read as JSON; a wrong one is a 415
        redirect_slashes=False,  # a redirect to the path with(out) its slash is built from the Host header: 404
    )
    app.state.safety = state
    app.state.swapper = swapper  # the hot swap's route reaches it here (hot_swap.swapper_of)
    install_error_handlers(app, REQUEST_FIELDS)
    # Innermost first: the body guard (size, time, in-flight bytes), then the early 429 of an
    # overloaded service (before any body byte is read), then the API key (checked before that),
    # then the request metrics (outermost: they see every answer).
    # innermost: reads the body through the guard below; checks /v1/* counts before any route validates
    app.add_middleware(StrictJsonMiddleware, limits=state.limits, refused_body_share=settings.refused_body_share)
    app.add_middleware(
        BodyGuardMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_inflight_body_bytes=settings.max_inflight_body_bytes,
    )
    app.add_middleware(EarlyRefusalMiddleware, state=state)
    # always installed: without a key it still turns the admin endpoints away
    app.add_middleware(ApiKeyMiddleware, api_key=api_key_of(settings), public_docs=settings.public_docs)
    app.add_middleware(moderations.OpenAIErrorShape)  # /v1/moderations answers errors in OpenAI's shape
    app.add_middleware(RequestMetricsMiddleware, metrics=state.metrics)
    app.include_router(routes.v1, dependencies=api_key_declaration(settings))
    app.include_router(routes.ops)
    app.include_router(admin_router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES)
    app.include_router(policy_admin.router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES)
    app.include_router(
        moderations.build_router(state, routes.predict, routes.CLIENT_CLOSED),
        dependencies=api_key_declaration(settings),
    )
    if game is not None:  # the break-it game: its routes reach it through app.state (breakit.api.game_of)
        app.state.breakit = game
        app.include_router(breakit_api.router, responses=ERROR_RESPONSES)
        app.include_router(
            breakit_api.admin_router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES
        )
        app.include_router(breakit_api.page_router)
    generate_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = apply_to_openapi(generate_openapi(), state.limits)
            moderations.apply_to_openapi(chat.apply_to_openapi(app.openapi_schema, state.limits), state.limits)
        # the model may be swapped while the API stays: its id is added per call, not cached
        info = {**app.openapi_schema["info"], "x-package-version": package_version()}
        info["x-model"] = state.model_id or None
        return {**app.openapi_schema, "info": info}

    app.openapi = openapi  # type: ignore[method-assign]
    return app
