"""Typed ZMQ PUSH/PULL wrappers: msgpack-encoded msgspec Structs, one Union decoder per socket."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

_encoder = msgspec.msgpack.Encoder()


class IpcDir:
    """A private (mode 0700) directory for the `ipc://` socket files; removed on close."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="arbor-"))
        os.chmod(self.path, 0o700)

    def endpoint(self, name: str) -> str:
        return f"ipc://{self.path / name}"

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class Pusher:
    """Sends Structs on a PUSH socket (connects, or binds when `bind`)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, bind: bool = False) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint) if bind else self.sock.connect(endpoint)

    def send(self, msg: msgspec.Struct) -> None:
        self.sock.send(_encoder.encode(msg), copy=False)

    def close(self) -> None:
        self.sock.close()


class Puller:
    """Receives Structs of the `kind` Union on a PULL socket (binds by default)."""

    def __init__(self, ctx: zmq.Context, endpoint: str, kind: Any, bind: bool = True) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint) if bind else self.sock.connect(endpoint)
        self._decoder = msgspec.msgpack.Decoder(kind)

    def recv(self, timeout_ms: int | None = None) -> Any:
        """The next message, or None when `timeout_ms` passes first (None waits forever)."""
        if timeout_ms is not None and not self.sock.poll(timeout_ms):
            return None
        return self._decoder.decode(self.sock.recv(copy=False))

    def drain(self) -> list[Any]:
        """Every message already queued, without waiting."""
        out: list[Any] = []
        while True:
            try:
                frame = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return out
            out.append(self._decoder.decode(frame))

    def close(self) -> None:
        self.sock.close()


class AsyncPuller:
    """`Puller` for an asyncio event loop (zmq.asyncio); never blocks the loop."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, kind: Any) -> None:
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self._decoder = msgspec.msgpack.Decoder(kind)

    async def recv(self) -> Any:
        return self._decoder.decode((await self.sock.recv(copy=False)).buffer)

    def close(self) -> None:
        self.sock.close()


class AsyncPusher:
    """`Pusher` for an asyncio event loop."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    async def send(self, msg: msgspec.Struct) -> None:
        await self.sock.send(_encoder.encode(msg), copy=False)

    def close(self) -> None:
        self.sock.close()
