"""The decode worker's side: give an incoming request KV slots for the prompt positions its
own radix cache lacks, ask the prefill worker to write them, and start decoding once they
are there."""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass

import msgspec
import numpy as np
import zmq

from arbor.runtime.config import ServerArgs
from arbor.runtime.disaggregation.protocol import (
    KVCancel,
    KVCancelled,
    KVDone,
    KVFailed,
    KVPull,
    ToDecode,
)
from arbor.runtime.disaggregation.transfer import make_transfer
from arbor.runtime.memory import KVPool
from arbor.runtime.messages import FinishAbort
from arbor.runtime.scheduler.kv_manager import KVManager
from arbor.runtime.scheduler.req import Req

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Pulled:
    req: Req
    deadline: float
    since: float  # when the pull went out
    nbytes: int  # KV bytes it asked for
    ended: bool = False  # the request ended (timeout, abort): its slots wait until nothing can write them


class DecodeReceiver:
    """Requests waiting for slots (`queue`) and for their KV (`pulled`, by room)."""

    def __init__(self, args: ServerArgs, kv: KVManager, pool: KVPool, counters: dict[str, float]) -> None:
        self.transfer = make_transfer(args.disaggregation_transfer_backend, pool, "decode")
        self.kv = kv
        self.ctx = zmq.Context()
        self.timeout = args.disaggregation_timeout_s
        self.counters = counters
        self.queue: list[tuple[Req, float]] = []  # (request, when it came)
        self.pulled: dict[int, _Pulled] = {}
        self.socks: dict[tuple[str, int], zmq.Socket] = {}
        self._decoder = msgspec.msgpack.Decoder(ToDecode)
        self._encoder = msgspec.msgpack.Encoder()
        self.sockets: list[zmq.Socket] = []  # replies are read each step while a pull is out

    @property
    def busy(self) -> bool:
        return bool(self.queue or self.pulled)

    @property
    def in_flight(self) -> int:
        """Requests whose KV was asked for and has not come yet."""
        return sum(not p.ended for p in self.pulled.values())

    @property
    def awaiting(self) -> int:
        return len(self.queue) + self.in_flight

    def takes(self, req: Req) -> bool:
        """A request with bootstrap info waits here for slots, then for its KV."""
        if req.bootstrap is None:
            return False
        self.queue.append((req, time.monotonic()))
        return True

    def keeps(self, req: Req) -> bool:
        return False

    def ended(self, req: Req) -> None:
        return None

    def step(self, capacity: int) -> tuple[list[Req], list[tuple[Req, KVDone]]]:
        """Pull KV for queued requests (while fewer than `capacity` run or wait for KV) and
        take in what arrived."""
        ended = self.pull(capacity - self.in_flight)
        arrived, failed = self.poll()
        return ended + failed, arrived

    def pull(self, capacity: int) -> list[Req]:
        """Give queued requests slots and ask their prefill workers for the KV, at most
        `capacity` of them. Returns the requests that waited over the timeout for slots (ended)."""
        ended, now = [], time.monotonic()
        while self.queue and capacity > 0:
            req, _ = self.queue[0]
            if not self.kv.attach(req):
                break
            if self.kv.reserve([req], [req.seq_len]) is None:
                self.kv.release(req)
                break
            self.queue.pop(0)
            capacity -= 1
            req.admitted = True
            self.counters["prompt_tokens"] += len(req.origin_ids)
            self.counters["cached_tokens"] += req.cached_tokens
            skip, end = req.kv_len, req.seq_len
            fill = req.fill_ids()[:end]
            self._send(req, KVPull(room=req.bootstrap.room, layout=self.transfer.layout, skip=skip, kv_len=end,
                                   tokens_crc=zlib.crc32(fill.tobytes()),
                                   dst_slots=self.kv.slots(req, skip, end).astype(np.int32).tobytes()))
            layout = self.transfer.layout
            nbytes = (end - skip) * layout.slot_bytes * 2 * len(layout.k_ptrs)
            self.pulled[req.bootstrap.room] = _Pulled(req, now + self.timeout, now, nbytes)
        for req, since in [q for q in self.queue if now - q[1] > self.timeout]:
            self.queue.remove((req, since))
            ended.append(_abort(req, f"no KV slots came free on this decode worker within {self.timeout:g} s", 503))
        return ended

    def poll(self) -> tuple[list[tuple[Req, KVDone]], list[Req]]:
        """Handle notifications and replies. Returns the requests whose KV is here (with the
        prefill worker's KVDone: the first token; their prompt is in the radix cache now) and those that
        ended (KV failed or timed out); an ended request's slots are freed once nothing can
        still write them."""
        arrived: list[tuple[Req, KVDone]] = []
        ended: list[Req] = []
        for raw in self.transfer.notifications():
            self._on(self._decode(raw), arrived, ended)
        for sock in self.socks.values():
            while True:
                try:
                    raw = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._on(self._decode(raw), arrived, ended)
        now = time.monotonic()
        for room, p in list(self.pulled.items()):
            if now <= p.deadline:
                continue
            if p.ended:  # the prefill worker never answered the cancel: it is gone
                self._free(room)
            else:
                message = (f"the KV of room {room} did not arrive from the prefill worker "
                           f"{p.req.bootstrap.host}:{p.req.bootstrap.port} within {self.timeout:g} s")
                ended.append(self._end(room, message, 504))
        return arrived, ended

    def _on(self, msg: object, arrived: list[tuple[Req, KVDone]], ended: list[Req]) -> None:
        p = self.pulled.get(getattr(msg, "room", -1))
        if p is None:
            return
        room = p.req.bootstrap.room
        if p.ended or isinstance(msg, KVCancelled):
            self._free(room)
            return
        if isinstance(msg, KVFailed):
            self.counters["kv_transfer_failures"] += 1
            self._free(room)
            ended.append(_abort(p.req, f"the prefill worker could not send the KV: {msg.message}", 502))
            return
        assert isinstance(msg, KVDone)
        del self.pulled[room]
        req = p.req
        if msg.kv_len != req.seq_len:
            self.kv.release(req)
            ended.append(_abort(req, f"the prefill worker computed {msg.kv_len} positions, this worker "
                                     f"expected {req.seq_len}", 502))
            return
        self.counters["kv_transfers"] += 1
        self.counters["kv_transfer_bytes"] += p.nbytes
        self.counters["kv_transfer_seconds"] += time.monotonic() - p.since
        req.kv_len = req.seq_len
        self.kv.cache_prefix(req)  # the prompt is now this worker's: later turns hit it here
        arrived.append((req, msg))

    def abort(self, rid: str) -> list[Req]:
        """End the queued or pulled requests of `rid` now."""
        ended = []
        for req, since in [q for q in self.queue if rid in (q[0].rid, q[0].group)]:
            self.queue.remove((req, since))
            ended.append(_abort(req, "aborted", 499))
        for room, p in list(self.pulled.items()):
            if not p.ended and rid in (p.req.rid, p.req.group):
                ended.append(self._end(room, "aborted", 499))
        return ended

    def _end(self, room: int, message: str, status: int) -> Req:
        """End a pulled request now; keep its slots until the prefill worker confirms it will
        not write them (or one more timeout passes)."""
        p = self.pulled[room]
        p.ended, p.deadline = True, time.monotonic() + self.timeout
        self._send(p.req, KVCancel(room=room))
        return _abort(p.req, message, status)

    def _free(self, room: int) -> None:
        self.kv.release(self.pulled.pop(room).req)

    def _send(self, req: Req, msg: KVPull | KVCancel) -> None:
        where = (req.bootstrap.host, req.bootstrap.port)
        sock = self.socks.get(where)
        if sock is None:
            sock = self.socks[where] = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{where[0]}:{where[1]}")
        try:
            sock.send(self._encoder.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("the bootstrap socket of %s:%d is full; dropped a %s", *where, type(msg).__name__)

    def _decode(self, raw: bytes) -> object:
        try:
            return self._decoder.decode(raw)
        except msgspec.DecodeError:
            logger.warning("ignored a malformed message from a prefill worker")
            return None

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        self.transfer.close()
        self.ctx.term()


def _abort(req: Req, message: str, status: int) -> Req:
    req.finish_reason = FinishAbort(message=message, status_code=status)
    return req
