"""The uvicorn API that dialogue_safety/service/server.py relies on, checked against the installed uvicorn:
the guarded protocol subclasses uvicorn's ``HttpToolsProtocol``. pyproject.toml pins uvicorn to the tested
minor version; these tests fail loudly, naming what changed, when another uvicorn is installed."""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

from uvicorn.protocols.http import httptools_impl

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = ast.parse(inspect.getsource(httptools_impl.HttpToolsProtocol))
# what the guarded protocol uses of uvicorn's protocol instance
PROTOCOL_ATTRIBUTES = {"transport", "loop", "pipeline"}
PROTOCOL_METHODS = {"connection_made", "connection_lost", "on_headers_complete", "on_response_complete"}
PROTOCOL_METHODS |= {"data_received", "on_message_begin", "on_message_complete", "send_400_response"}


def _uvicorn_pin() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    (pin,) = [d for d in deps if d.startswith("uvicorn")]
    return pin


def test_the_installed_uvicorn_is_the_pinned_minor_version() -> None:
    pin = _uvicorn_pin()
    match = re.fullmatch(r"uvicorn\[standard\]>=(\d+)\.(\d+)(?:\.\d+)?,<(\d+)\.(\d+)", pin)
    assert match, f"pyproject.toml must pin uvicorn to one minor version (>=X.Y,<X.Y+1), not {pin!r}"
    major, minor = int(match[1]), int(match[2])
    assert (int(match[3]), int(match[4])) == (major, minor + 1), f"{pin!r} spans more than one minor version"
    installed = tuple(int(p) for p in version("uvicorn").split(".")[:2])
    assert installed == (major, minor), (
        f"uvicorn {version('uvicorn')} is installed; dialogue_safety/service/server.py is tested against "
        f"{major}.{minor} ({pin}): rerun this file and the server tests before moving the pin"
    )


def test_the_protocol_attributes_and_methods_the_guarded_protocol_uses_exist() -> None:
    assigned = {
        node.attr
        for node in ast.walk(PROTOCOL)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
        if isinstance(node.ctx, ast.Store)
    }
    assert assigned >= PROTOCOL_ATTRIBUTES, f"uvicorn's protocol lost {sorted(PROTOCOL_ATTRIBUTES - assigned)}"
    for method in PROTOCOL_METHODS:
        assert callable(getattr(httptools_impl.HttpToolsProtocol, method, None)), f"uvicorn lost {method}"
    assert "default_headers" in inspect.getsource(httptools_impl.HttpToolsProtocol.on_headers_complete)


def test_every_parser_error_goes_through_send_400_response() -> None:
    """The guarded protocol answers parser errors in the JSON error shape by overriding
    ``send_400_response``: uvicorn must still write its plain-text 400 nowhere else."""
    source = inspect.getsource(httptools_impl.HttpToolsProtocol)
    assert source.count("STATUS_LINE[400]") == 1 and "def send_400_response" in source
    data_received = inspect.getsource(httptools_impl.HttpToolsProtocol.data_received)
    assert "except httptools.HttpParserError" in data_received and "self.send_400_response(" in data_received
    cycle = inspect.getsource(httptools_impl.RequestResponseCycle)
    # a request whose body broke the parser: the cycle it started is marked disconnected (its sends dropped)
    assert "self.response_started = False" in cycle and "if self.disconnected:" in cycle
