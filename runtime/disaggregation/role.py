"""What the scheduler sees of a disaggregated worker: one object, its prefill or decode side."""

from __future__ import annotations

from typing import Protocol

import zmq

from arbor.runtime.config import DisaggArgs
from arbor.runtime.disaggregation.protocol import KVDone
from arbor.runtime.disaggregation.secret import require_secret
from arbor.runtime.kv.manager import KVManager
from arbor.runtime.kv.pool import KVPool
from arbor.runtime.scheduler.req import Req
from arbor.runtime.scheduler.stats import SchedulerStats


class Role(Protocol):
    """Requests this side holds besides the scheduler's queues. Requests it returns as ended
    have their finish reason set and their KV already dealt with (freed, or kept until no
    peer can write it)."""

    sockets: list[zmq.Socket]  # besides the inbox, sockets whose messages need a step

    @property
    def busy(self) -> bool:
        """Whether a request waits on a transfer, or a peer's message waits here."""
        ...

    @property
    def awaiting(self) -> int:
        """Requests counted as waiting besides the scheduler's queue (the router reads it)."""
        ...

    def takes(self, req: Req) -> bool:
        """Whether a new request waits here instead of in the scheduler's queue."""
        ...

    def keeps(self, req: Req) -> bool:
        """Whether a request that just got its first token stays here (its KV to send)."""
        ...

    def ended(self, req: Req) -> None:
        """The scheduler ended a request (aborted, failed) before this side held it."""
        ...

    def step(self, capacity: int) -> tuple[list[Req], list[tuple[Req, KVDone]]]:
        """Move transfers on. Returns the requests that ended and those whose KV arrived
        (with the first token), at most `capacity` newly started."""
        ...

    def abort(self, rid: str) -> list[Req]: ...

    def close(self) -> None: ...


class NullRole:
    """A worker that does both prefill and decode: it holds no request and moves no KV. The
    prefill and decode sides start from it and override what their side does."""

    def __init__(self) -> None:
        self.sockets: list[zmq.Socket] = []

    @property
    def busy(self) -> bool:
        return False

    @property
    def awaiting(self) -> int:
        return 0

    def takes(self, req: Req) -> bool:
        return False

    def keeps(self, req: Req) -> bool:
        return False

    def ended(self, req: Req) -> None:
        return None

    def step(self, capacity: int) -> tuple[list[Req], list[tuple[Req, KVDone]]]:
        return [], []

    def abort(self, rid: str) -> list[Req]:
        return []

    def close(self) -> None:
        return None


def make_role(disagg: DisaggArgs, host: str, kv: KVManager, pool: KVPool, stats: SchedulerStats) -> Role:
    """The side `--disaggregation-mode` names; a NullRole for a worker that does both. `host`
    is the interface (--host) its bootstrap socket and KV transfer use."""
    if disagg.mode == "null":
        return NullRole()
    secret = require_secret(disagg)
    if disagg.mode == "prefill":
        from arbor.runtime.disaggregation.prefill import PrefillSender

        return PrefillSender(disagg, host, kv, pool, stats, secret)
    from arbor.runtime.disaggregation.decode import DecodeReceiver

    return DecodeReceiver(disagg, host, kv, pool, stats, secret)
