"""A local ``dialogue-safety serve`` for the benchmarks: a subprocess on 127.0.0.1, started, waited for
(``/ready``), measured (RSS) and stopped; its command line and ``SAFETY_*`` environment."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from dialogue_safety.service.settings import ServiceSettings
from lab.bench.http_client import HOST


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def rss(self) -> int | None:
        return rss_bytes(self.process.pid)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@contextmanager
def running_server(cmd: list[str], env: dict[str, str], port: int, *, start_timeout_s: float) -> Iterator[Server]:
    log = Path(tempfile.mkstemp(prefix="bench-http-", suffix=".log")[1])
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    server = Server(process, f"http://{HOST}:{port}", log)
    try:
        deadline = time.monotonic() + start_timeout_s
        with httpx.Client(base_url=server.url, timeout=2.0) as client:
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"server exited with {process.returncode}:\n{server.log_tail()}")
                try:
                    if client.get("/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready after {start_timeout_s:.0f}s:\n{server.log_tail()}")
                time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.unlink(missing_ok=True)


def service_cmd(model_dir: Path, port: int, variant: str | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "dialogue_safety.service.cli",
        "--model",
        str(model_dir),
        "--host",
        HOST,
        "--port",
        str(port),
    ]
    cmd += ["--log-level", "warning", "--no-access-log"]
    return cmd + (["--variant", variant] if variant else [])


def server_settings(items: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs → settings for :func:`service_env` (checked against ServiceSettings)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().lower().removeprefix("safety_")
        if not sep or name not in ServiceSettings.model_fields:
            raise SystemExit(f"--server-setting {item!r}: expected NAME=VALUE with NAME a service setting")
        out[name] = value
    return out


def service_env(**settings: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETY_")}
    env.update({f"SAFETY_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def mib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)
