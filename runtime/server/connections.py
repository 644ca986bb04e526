"""Connection limits for the HTTP server: how many, how long a client may take to send its
headers, and how long a connection may sit idle. (Slow bodies: `state.read_body`.)"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from arbor.runtime.config import HttpArgs


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers: a connection
    that opens and sends nothing, or trickles a header, is closed when it passes. The
    deadline starts when the connection opens and again after each response."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete and self._deadline is not None:
            self._deadline.cancel()  # the headers are in: the request's own limits apply now
            self._deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()


def uvicorn_config(app: Any, http: HttpArgs, log_level: str, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration of an Arbor app, with the connection limits of `http`."""
    protocol = type("ArborH11Protocol", (DeadlineH11Protocol,), {"header_timeout_s": http.header_timeout_s})
    settings: dict[str, Any] = {
        "host": http.host,
        "port": http.port,
        "log_level": log_level,
        "timeout_graceful_shutdown": 5,
        "http": protocol,
        "limit_concurrency": http.max_connections,
        "timeout_keep_alive": http.keep_alive_timeout_s,
        # The client's address is the socket's: X-Forwarded-For from a loopback peer must not
        # pass --disaggregation-allowed-peers (uvicorn trusts it from 127.0.0.1 by default).
        "proxy_headers": False,
    }
    return uvicorn.Config(app, **{**settings, **overrides})
