"""Experiment: the overloaded service's 429 answered by the HTTP protocol from the request head.

The service has one early-refusal entry point, the app's ASGI middleware
(:class:`dialogue_safety.service.admission.EarlyRefusalMiddleware`): portable to any ASGI server, but each
refusal still costs uvicorn's request cycle (an ASGI task, the middleware stack). This experiment
serves the same app with a protocol that asks the same rule
(:meth:`dialogue_safety.service.state.ServiceState.early_refusal`) as soon as a request head is
parsed and writes the 429 itself (no task, no middleware; the body that follows is skipped), so that
``python -m lab.bench abuse --door head`` can measure both doors under the same load::

    python -m lab.experiments.head_door --model models/default --port 8000   # the serve command's options

It is a measurement, not a product path: it relies on uvicorn's protocol internals the way the
service's own protocol class does (tests/test_uvicorn_contract.py).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from dialogue_safety.service import cli, server
from dialogue_safety.service.errors import error_response_bytes
from dialogue_safety.service.state import ServiceState


def head_door(protocol: type[Any], state: ServiceState) -> type[Any]:
    """``protocol`` (the service's guarded protocol class) answering the early 429 from the head."""

    class HeadDoorProtocol(protocol):
        def on_headers_complete(self) -> None:
            cycle: Any = self.cycle  # type: ignore[has-type]  # set by uvicorn per request
            idle = (cycle is None or cycle.response_complete) and not self.pipeline
            if idle and not self.parser.should_upgrade():
                method = self.parser.get_method().decode("ascii", "replace")
                path = self.url.partition(b"?")[0].decode("ascii", "replace")  # uvicorn sets scope["path"] later
                refusal = state.early_refusal({**self.scope, "method": method, "path": path})
                if refusal is not None:
                    self._disarm_head_timer()
                    self._in_head = False
                    keep_alive = self.parser.get_http_version() == "1.1" and self.parser.should_keep_alive()
                    self.cycle = server._ANSWERED  # uvicorn skips the body of a complete response
                    self.transport.write(
                        error_response_bytes(refusal, self.server_state.default_headers, keep_alive=keep_alive)
                    )
                    if keep_alive:
                        self.on_response_complete()
                    else:
                        self.transport.close()
                    return
            super().on_headers_complete()

    return HeadDoorProtocol


def main(argv: Sequence[str] | None = None) -> int:
    """``dialogue-safety serve`` with the head door (same options and ``SAFETY_*`` settings)."""
    configure = server.uvicorn_config

    def with_head_door(app: Any, settings: Any, **overrides: Any) -> Any:
        config = configure(app, settings, **overrides)
        assert isinstance(config.http, type)  # the service's protocol class (server.guarded_protocol)
        config.http = head_door(config.http, app.state.safety)
        return config

    server.uvicorn_config = with_head_door  # the CLI imports it when it serves
    try:
        return cli.main(argv, prog="python -m lab.experiments.head_door")
    finally:
        server.uvicorn_config = configure


if __name__ == "__main__":
    sys.exit(main())
