"""A minimal keep-alive HTTP/1.1 client for load generation (one connection per worker, ~tens of µs a request)."""

from __future__ import annotations

import asyncio
import socket
from contextlib import suppress

HOST = "127.0.0.1"


class RawHttpClient:
    """A minimal HTTP/1.1 keep-alive client for load generation: one connection per worker.

    httpx costs ~1-2 ms of CPU per request, which on a 2-core machine steals a large share of
    the cores the server is being measured on; this client costs a few tens of microseconds.
    It speaks just what the service answers (Content-Length bodies) and reconnects after errors.
    """

    def __init__(self, url: str, timeout_s: float, source: str | None = None) -> None:
        host_port = url.split("://", 1)[1].rstrip("/")
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.timeout_s = timeout_s
        self.source = source  # the local address to connect from (another loopback address: another client)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            local = (self.source, 0) if self.source else None
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, local_addr=local)
            sock = self._writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self._reader, self._writer

    async def post(self, path: str, body: bytes, headers: bytes = b"") -> tuple[int, bytes]:
        return await self.request("POST", path, body, headers)

    async def request(self, method: str, path: str, body: bytes = b"", headers: bytes = b"") -> tuple[int, bytes]:
        """(status, body) of one request on the kept-alive connection (``body`` with a JSON content type)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await self._connect()
                writer.write(
                    method.encode()
                    + b" "
                    + path.encode()
                    + b" HTTP/1.1\r\nHost: "
                    + self.host.encode()
                    + b"\r\nContent-Type: application/json\r\n"
                    + headers
                    + b"Content-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                status = int((await reader.readline()).split(b" ", 2)[1])
                length, close = 0, False
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    name = name.strip().lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"connection" and value.strip().lower() == b"close":
                        close = True
                payload = await reader.readexactly(length) if length else b""
                if close:
                    await self.close()
                return status, payload
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with suppress(Exception):
                await writer.wait_closed()
