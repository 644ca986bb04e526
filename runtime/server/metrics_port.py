"""--metrics-port: the whole server's /metrics on 127.0.0.1 without a key, for a Prometheus
scraper on this machine (on the main port, /metrics needs the admin key).

A deliberately small HTTP/1.x listener: it answers one GET /metrics per connection and closes
it, and bounds what a client can hold (the header size, the time to send it, the connections).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from arbor.runtime.io.tokenizer_manager import EngineDead
from arbor.runtime.server.errors import ApiError
from arbor.runtime.server.redact import public

LOOPBACK = "127.0.0.1"  # always: the port has no key, so only this machine may reach it
HEAD_LIMIT = 8192  # bytes of request line and headers
HEAD_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 16
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsListener:
    """Serves `render()` (the exposition text) at GET /metrics on LOOPBACK:`port`."""

    def __init__(self, port: int, render: Callable[[], Awaitable[bytes]]) -> None:
        self.port = port
        self.render = render
        self._server: asyncio.Server | None = None
        self._open = 0

    async def start(self) -> None:
        """Bind and listen; a port in use raises OSError (the server then fails to start)."""
        self._server = await asyncio.start_server(self._serve, LOOPBACK, self.port, limit=HEAD_LIMIT)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open <= MAX_CONNECTIONS:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
                writer.write(await self._answer(head.split(b"\r\n", 1)[0]))
                await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that sends too little, too much or too slowly just loses its connection
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, request_line: bytes) -> bytes:
        parts = request_line.split()
        if len(parts) != 3 or parts[1].split(b"?")[0] != b"/metrics":
            return _response(404, b"only /metrics is served on this port\n")
        if parts[0] not in (b"GET", b"HEAD"):
            return _response(405, b"use GET /metrics\n")
        try:
            body = await self.render()
        except (ApiError, EngineDead) as e:  # the runtime is starting or has stopped
            return _response(503, public(str(e)).encode() + b"\n")
        return _response(200, body, head_only=parts[0] == b"HEAD")


@contextlib.asynccontextmanager
async def metrics_listener(port: int | None, render: Callable[[], Awaitable[bytes]]) -> AsyncIterator[None]:
    """A MetricsListener on `port` while the block runs (nothing when `port` is None)."""
    if port is None:
        yield
        return
    listener = MetricsListener(port, render)
    await listener.start()
    try:
        yield
    finally:
        await listener.stop()


def _response(status: int, body: bytes, head_only: bool = False) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Service Unavailable")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + (b"" if head_only else body)
