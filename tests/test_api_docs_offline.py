"""/docs and /redoc render without the internet: every asset they load is served by the app itself.
The OpenAPI version is the package's (one version number: pyproject.toml)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
from service_conftest import FakeClassifier, LiveServer, live_server

REPO = Path(__file__).resolve().parents[1]
ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|(?:url|specUrl)\s*:\s*["']([^"']+)["']""")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    with live_server(classifier=FakeClassifier()) as live:
        yield live


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(server: LiveServer, page: str) -> None:
    with server.client() as client:
        r = client.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        urls = [a or b for a, b in ASSET.findall(r.text)]
        assert any(u.endswith(".js") for u in urls), f"{page} loads its JavaScript: {urls}"
        remote = [u for u in urls if re.match(r"(https?:)?//", u)]
        assert remote == [], f"{page} loads assets from elsewhere: {remote}"
        assert "fonts.googleapis.com" not in r.text and "cdn.jsdelivr.net" not in r.text
        for url in urls:
            asset = client.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 100, url


def test_one_version_for_package_and_openapi(server: LiveServer) -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert version("dialogue-safety") == declared, "reinstall the package (scripts/env.sh dev) after a version bump"
    with server.client() as client:
        assert client.get("/openapi.json").json()["info"]["version"] == declared


def test_package_and_model_versions_are_stated_apart(server: LiveServer) -> None:
    """The API (package) and the model are versioned separately; both documents name both."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    with server.client() as client:
        assert client.get("/ready").status_code == 200
        info = client.get("/openapi.json").json()["info"]
        serving = client.get("/v1/model").json()
        answer = client.post("/v1/classify", json={"utterance": "have a nice day"}).json()
    model_id = f"{serving['name']}@{serving['version']}"
    assert info["version"] == info["x-package-version"] == declared
    assert info["x-model"] == serving["serving"]["model"] == answer["model"] == model_id
    assert serving["serving"]["package_version"] == declared
    assert "package" in info["description"] and "model" in info["description"]
