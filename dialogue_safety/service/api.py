"""The old import path of the app factory: ``dialogue_safety.service.api:create_app`` (uvicorn ``--factory``).

The API lives in :mod:`dialogue_safety.service.app` (factory, middleware, lifespan),
:mod:`dialogue_safety.service.routes` and :mod:`dialogue_safety.service.schemas`.
"""

from dialogue_safety.service.app import create_app

__all__ = ["create_app"]
