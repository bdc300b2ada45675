"""The HTTP client against answers the service never gives but a network does: a proxy's page, a connection cut
before or during the answer, a timeout, an error body of another shape. Each is a ClientError (status 0 when no
whole answer came), never a raw transport exception; arguments the service would refuse fail before sending."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from dialogue_safety import Client
from dialogue_safety.client import ClientError, prediction_from_answer

ANSWER = b'{"label": "SAFE", "score": 0.1, "threshold": 0.5, "language": "und", "language_supported": null}'


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        kind = self.path.rsplit("/", 1)[-1]
        if kind == "hangup":
            self.close_connection = True
            self.connection.shutdown(2)  # no answer at all
            return
        if kind == "slow":
            time.sleep(1.0)
        body = {
            "page": b"<html>502 Bad Gateway</html>",
            "odd": b'{"error": "nope"}',
            "cut": ANSWER,
            "slow": ANSWER,
            "classify": ANSWER,
        }[kind]
        status = 400 if kind == "odd" else 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) + (100 if kind == "cut" else 0)))  # cut: promised more
        self.end_headers()
        self.wfile.write(body)
        if kind == "cut":
            self.close_connection = True


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/page", 200, "bad_response"),
        ("/hangup", 0, "unreachable"),
        ("/cut", 0, "unreachable"),
        ("/slow", 0, "unreachable"),
    ],
)
def test_an_answer_that_is_not_the_services_is_a_client_error(url: str, path: str, status: int, code: str) -> None:
    client = Client(url, timeout_s=0.3, retries=0)
    with pytest.raises(ClientError) as caught:
        client.post(path, {})
    assert (caught.value.status, caught.value.code) == (status, code), caught.value


def test_an_error_body_of_another_shape_keeps_its_message(url: str) -> None:
    with pytest.raises(ClientError) as caught:
        Client(url, retries=0).post("/odd", {})
    assert caught.value.status == 400 and "nope" in caught.value.message


def test_an_unknown_language_is_none_not_unsupported(url: str) -> None:
    prediction = Client(url).classify("ok")
    assert prediction.read.language == "und" and prediction.read.language_supported is None
    assert prediction_from_answer({**_answer(), "language_supported": False}).read.language_supported is False


def _answer() -> dict[str, object]:
    return {"label": "SAFE", "score": 0.1, "threshold": 0.5}


def test_arguments_the_service_would_refuse_fail_before_sending(url: str) -> None:
    client = Client(url)
    with pytest.raises(TypeError, match="needs the utterance"):
        client.classify()
    with pytest.raises(TypeError, match="not both"):
        client.classify("you idiot", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(TypeError, match="history is a list of turns"):
        client.classify("so what", history="I lost my job")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"conversation\[1\] is not a chat message"):
        client.classify_conversation([{"role": "user", "content": "hi"}, {"content": "no role"}])
