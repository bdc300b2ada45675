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

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from dialogue_safety.breakit import api as breakit_api
from dialogue_safety.service import moderations, policy_admin, routes
from dialogue_safety.service.admission import EarlyRefusalMiddleware
from dialogue_safety.service.auth import ApiKeyMiddleware, api_key_declaration, api_key_of, log_auth_state
from dialogue_safety.service.errors import ERROR_RESPONSES, install_error_handlers
from dialogue_safety.service.hot_swap import ModelSwapper, admin_router
from dialogue_safety.service.json_body import StrictJsonMiddleware
from dialogue_safety.service.limits import BodyGuardMiddleware
from dialogue_safety.service.openapi import install_openapi
from dialogue_safety.service.routes import package_version
from dialogue_safety.service.schemas import REQUEST_FIELDS
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import ClassifierFactory, ServiceState, load_onnx_classifier
from dialogue_safety.service.telemetry import RequestMetricsMiddleware


def create_app(
    settings: ServiceSettings | None = None,
    *,
    classifier_factory: ClassifierFactory | None = None,
    on_fatal: Callable[[str], None] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> FastAPI:
    """Build the app; ``settings`` default to the ``SAFETY_*`` environment. ``on_fatal`` is called (on the
    event loop, with the load error) when the model cannot be loaded: the CLI stops the server then; ``on_ready``
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
    app.state.safety = state  # read by the one dependency every route reaches it through (state.State)
    app.state.swapper = swapper  # read by the hot swap's route, through its dependency (hot_swap.swapper_of)
    install_error_handlers(app, REQUEST_FIELDS)
    # The middlewares, innermost first. Each does what nothing else does, before the route runs:
    # - StrictJsonMiddleware: refuses duplicate keys, deep nesting and counts past a limit on the raw body
    #   (FastAPI's parser keeps the last of two keys and only checks counts after validating every element),
    #   and reads a client's large bodies one at a time, pausing them after one is refused (lab/notes/abuse.md);
    # - BodyGuardMiddleware: the body's size, time and in-flight bytes while it arrives (FastAPI has none
    #   of these but a plain-text size limit);
    # - EarlyRefusalMiddleware: the 429 of an overloaded service before any body byte is read (a refusal
    #   must cost far less than an answer: lab/notes/abuse.md);
    # - ApiKeyMiddleware: 401 before any body byte is read (a FastAPI dependency runs after the body is
    #   parsed), and the admin endpoints turned away without a key (so it is always installed);
    # - RequestMetricsMiddleware (outermost): counts and times every answer, those of the middlewares too.
    app.add_middleware(StrictJsonMiddleware, limits=state.limits, refused_body_share=settings.refused_body_share)
    app.add_middleware(
        BodyGuardMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_inflight_body_bytes=settings.max_inflight_body_bytes,
    )
    app.add_middleware(EarlyRefusalMiddleware, refusal=state.early_refusal)
    app.add_middleware(ApiKeyMiddleware, api_key=api_key_of(settings), public_docs=settings.public_docs)
    app.add_middleware(RequestMetricsMiddleware, metrics=state.metrics)
    app.include_router(routes.v1, dependencies=api_key_declaration(settings))
    app.include_router(moderations.router, dependencies=api_key_declaration(settings))
    app.include_router(routes.ops)
    app.include_router(admin_router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES)
    app.include_router(policy_admin.router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES)
    if game is not None:  # the break-it game: its routes reach it through their dependency (breakit.api.game_of)
        app.state.breakit = game
        app.include_router(breakit_api.router, responses=ERROR_RESPONSES)
        app.include_router(
            breakit_api.admin_router, dependencies=api_key_declaration(settings), responses=ERROR_RESPONSES
        )
        app.include_router(breakit_api.page_router)
    install_openapi(app, state)
    return app
