"""``python -m lab.bench door``: the files of ``dialogue_safety/`` one request crosses on its way to the model.

The real service (:func:`dialogue_safety.service.app.create_app` under
:func:`dialogue_safety.service.server.uvicorn_config`, a real uvicorn server on 127.0.0.1 in a thread of this
process) loads the model, answers one warm-up request per endpoint, and then serves each endpoint's request once
more while a profiler (``threading.setprofile``, set before the server's threads start, and ``sys.setprofile``)
records the ``co_filename`` of every Python frame that runs, in every thread (event loop, encoding, inference,
worker threads), from just before the request is sent until a moment after its answer came back. Frames outside
the package are not counted. What runs in native code (onnxruntime, tokenizers) has no Python frame.

It prints JSON and a markdown table: per endpoint, the number of ``dialogue_safety/`` files crossed and which;
the figure the serving path is held to is the default ``/v1/classify`` request's (no explanation, one history
turn). Counts, not timings: a loaded machine gives the same figure.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

import dialogue_safety
from dialogue_safety.core.model_dir import default_model_dir
from lab.bench.emit import emit_report
from lab.bench.local_server import free_port

PACKAGE = Path(dialogue_safety.__file__).resolve().parent
SETTLE_S = 0.3  # after an answer: what the server still runs for the request (metrics, release) is counted too
#: endpoint name -> (path, JSON body); "classify" is the default request the serving path is held to
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "classify": ("/v1/classify", {"history": ["what did you think of the film?"], "utterance": "you are an idiot"}),
    "classify_messages": (
        "/v1/classify",
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "you are an idiot"}]},
    ),
    "batch": ("/v1/classify/batch", {"items": ["have a nice day", {"utterance": "you idiot", "history": ["hi"]}]}),
    "conversation": ("/v1/classify/conversation", {"turns": ["hi", "you idiot"]}),
    "moderations": ("/v1/moderations", {"input": "you are an idiot"}),
    "explain": ("/v1/classify", {"utterance": "you are an idiot", "explain": True}),
}


class FrameFiles:
    """The package files of the Python frames that run while :attr:`on` is set (any thread)."""

    def __init__(self) -> None:
        self.on = False
        self.files: dict[str, set[str]] = {}
        self._prefix = str(PACKAGE) + "/"

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.on or event != "call":
            return
        name = frame.f_code.co_filename
        if name.startswith(self._prefix):
            self.files.setdefault(name[len(self._prefix) - len("dialogue_safety/") :], set()).add(frame.f_code.co_name)

    def install(self) -> None:
        threading.setprofile(self)  # every thread started from now on: the server's loop, its workers
        sys.setprofile(self)

    def remove(self) -> None:
        threading.setprofile(None)
        sys.setprofile(None)


def _serve(model_dir: Path, port: int, settings: dict[str, Any]) -> tuple[Any, threading.Thread]:
    import uvicorn

    from dialogue_safety.service.app import create_app
    from dialogue_safety.service.server import uvicorn_config
    from dialogue_safety.service.settings import ServiceSettings

    service = ServiceSettings(model_dir=model_dir, host="127.0.0.1", port=port, **settings)
    server = uvicorn.Server(uvicorn_config(create_app(service), service, log_level="warning"))
    thread = threading.Thread(target=server.run, name="door-server", daemon=True)
    thread.start()
    return server, thread


def crossed(
    model_dir: Path, names: Sequence[str], *, variant: str | None = None, start_timeout_s: float = 300.0
) -> dict[str, dict[str, list[str]]]:
    """Per endpoint of ``names``, the package files its request crossed and the functions that ran in each
    (sorted), measured as described above."""
    port = free_port()
    recorder = FrameFiles()
    recorder.install()
    server, thread = _serve(model_dir, port, {"variant": variant})
    out: dict[str, dict[str, list[str]]] = {}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
            deadline = time.monotonic() + start_timeout_s
            while True:
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or not thread.is_alive():
                    raise SystemExit("the service did not become ready")
                time.sleep(0.2)
            for name in names:
                path, body = REQUESTS[name]
                client.post(path, json=body).raise_for_status()  # warm-up: first-call imports are not counted
                time.sleep(SETTLE_S)
                recorder.files.clear()
                recorder.on = True
                client.post(path, json=body).raise_for_status()
                time.sleep(SETTLE_S)
                recorder.on = False
                out[name] = {f: sorted(recorder.files[f]) for f in sorted(recorder.files)}
    finally:
        recorder.remove()
        server.should_exit = True
        thread.join(30)
    return out


def main(argv: Sequence[str] | None = None, prog: str = "python -m lab.bench door") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None, help="default: the package's default model")
    parser.add_argument("--variant", default=None, help="the ONNX variant to serve (default: the card's)")
    parser.add_argument("--endpoints", nargs="+", choices=list(REQUESTS), default=list(REQUESTS))
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON report here")
    args = parser.parse_args(argv)
    model_dir = args.model_dir or default_model_dir()
    files = crossed(model_dir, args.endpoints, variant=args.variant)
    report = {
        "what": "dialogue_safety/ files whose Python frames ran while one request was served (after a warm-up)",
        "model_dir": str(model_dir),
        "variant": args.variant,
        "endpoints": {
            name: {"path": REQUESTS[name][0], "body": REQUESTS[name][1], "files": len(f), "crossed": f}
            for name, f in files.items()
        },
    }
    for name, f in files.items():
        report["endpoints"][name]["service_files"] = sum(x.startswith("dialogue_safety/service/") for x in f)
    everything = sorted({f for fs in files.values() for f in fs})
    header = "| file | " + " | ".join(files) + " |"
    rows = [header, "|---|" + "---|" * len(files)]
    rows += [f"| {f} | " + " | ".join("x" if f in files[n] else "" for n in files) + " |" for f in everything]
    rows.append("| **files** | " + " | ".join(str(len(files[n])) for n in files) + " |")
    service = [report["endpoints"][n]["service_files"] for n in files]
    rows.append("| **of them in service/** | " + " | ".join(str(c) for c in service) + " |")
    emit_report(report, "\n".join(rows), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
