"""The decode worker's side: give an incoming request KV slots for the prompt positions its
own radix cache lacks, ask the prefill worker to write them into a staging buffer registered
for that room alone, and start decoding once they are there (copied into the pool).

Trust: the bootstrap fields were checked at the front door (only the router, holding the PD
secret, may set them; only configured prefill peers). Here every reply must be signed with the
secret, and "KV done" counts only as the NIXL notification from the agent that wrote it,
carrying the nonce of this room's pull.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import torch
import zmq

from arbor.runtime.config import DisaggArgs
from arbor.runtime.disaggregation.peer_sockets import PeerSockets
from arbor.runtime.disaggregation.protocol import (
    BootstrapCodec,
    KVCancel,
    KVDone,
    KVFailed,
    KVPull,
    reject,
)
from arbor.runtime.disaggregation.role import NullRole
from arbor.runtime.disaggregation.transfer import Staging, make_transfer
from arbor.runtime.io.messages import FinishAbort
from arbor.runtime.kv.manager import KVManager
from arbor.runtime.kv.pool import KVPool
from arbor.runtime.scheduler.req import Req
from arbor.runtime.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)
MAX_PEER_SOCKETS = 64  # prefill peers with an open socket; the least recently used closes beyond (its pulls time out)
MESSAGES_PER_STEP = 256  # replies read from one peer's socket in one step, at most
FINISHED_ROOMS = 4096  # rooms that ended here, so a late (genuine) reply for one is not called forged


@dataclass(eq=False)
class _Pulled:
    req: Req
    deadline: float
    since: float  # when the pull went out
    nbytes: int  # KV bytes it asked for
    staging: Staging
    nonce: bytes
    peer: tuple[str, int]
    ended: bool = False  # the request ended (timeout, abort): its staging waits until nothing can write it


class DecodeReceiver(NullRole):
    """Requests waiting for slots (`queue`) and for their KV (`pulled`, by room)."""

    def __init__(
        self, disagg: DisaggArgs, host: str, kv: KVManager, pool: KVPool, stats: SchedulerStats, secret: str
    ) -> None:
        self.transfer = make_transfer(disagg.transfer_backend, pool, "decode", host, disagg.ib_device)
        self.kv = kv
        self.codec = BootstrapCodec(secret)
        self.ctx = zmq.Context()
        self.timeout = disagg.timeout_s
        self.staging_budget = disagg.staging_mb << 20
        self.stats = stats
        self.queue: list[tuple[Req, float]] = []  # (request, when it came)
        self.pulled: dict[int, _Pulled] = {}
        self.socks = PeerSockets(self.ctx, MAX_PEER_SOCKETS)
        self.finished: OrderedDict[int, None] = OrderedDict()
        self.sockets: list[zmq.Socket] = []  # none to wake the idle wait: `busy` keeps the loop stepping

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

    @property
    def staged_bytes(self) -> int:
        """Bytes of staging buffers held now (KV on its way in, or waiting for no more writes)."""
        return sum(p.staging.buffer.nbytes for p in self.pulled.values())

    def takes(self, req: Req) -> bool:
        """A request with bootstrap info waits here for slots, then for its KV."""
        if req.bootstrap is None:
            return False
        self.queue.append((req, time.monotonic()))
        return True

    def step(self, capacity: int) -> tuple[list[Req], list[tuple[Req, KVDone]]]:
        """Pull KV for queued requests (while fewer than `capacity` run or wait for KV) and
        take in what arrived."""
        ended = self.pull(capacity - self.in_flight)
        arrived, failed = self.poll()
        return ended + failed, arrived

    def pull(self, capacity: int) -> list[Req]:
        """Give queued requests slots and a staging buffer, and ask their prefill workers for
        the KV, at most `capacity` of them. Returns the requests that waited over the timeout
        for slots (ended)."""
        ended, now = [], time.monotonic()
        while self.queue and capacity > 0:
            req, _ = self.queue[0]
            room = req.bootstrap.room if req.bootstrap is not None else -1
            if room in self.pulled:  # its staging buffer and slots would be lost under the other's
                self.queue.pop(0)
                ended.append(
                    _abort(
                        req,
                        f"bootstrap_room {room} is already in flight on this decode worker; "
                        "give each request its own room",
                        409,
                    )
                )
                continue
            if self.pulled and self.staged_bytes + self._staging_bytes(req) > self.staging_budget:
                break
            if not self.kv.attach(req):
                break
            if self.kv.reserve([req], [req.seq_len]) is None:
                self.kv.release(req)
                break
            self.queue.pop(0)
            capacity -= 1
            req.admitted = True
            self.stats.prompt_tokens += len(req.origin_ids)
            self.stats.cached_tokens += req.cached_tokens
            try:
                self._pull(req, now)
            except Exception as exc:  # staging memory, a peer address ZMQ refuses: this request only
                logger.warning("could not pull the KV of room %d", room, exc_info=True)
                self.kv.release(req)
                ended.append(_abort(req, f"could not ask the prefill worker for the KV: {exc}", 503))
        for req, since in [q for q in self.queue if now - q[1] > self.timeout]:
            self.queue.remove((req, since))
            ended.append(
                _abort(
                    req,
                    f"no KV slots (or staging memory, --disaggregation-staging-mb) came free on "
                    f"this decode worker within {self.timeout:g} s",
                    503,
                )
            )
        return ended

    def _staging_bytes(self, req: Req) -> int:
        """A staging buffer's size for `req` (before its cache hit is known: at most this)."""
        layout = len(self.transfer.pool.k) * 2 * self.transfer.slot_bytes
        return (req.seq_len - req.kv_len) * layout

    def _pull(self, req: Req, now: float) -> None:
        boot = req.bootstrap
        assert boot is not None
        skip, end = req.kv_len, req.seq_len
        staging = self.transfer.stage(end - skip)
        nonce = os.urandom(16)
        fill = req.fill_ids()[:end]
        peer = (boot.host, boot.port)
        try:
            self._send(
                peer,
                KVPull(
                    room=boot.room,
                    layout=staging.layout,
                    skip=skip,
                    kv_len=end,
                    tokens_crc=zlib.crc32(fill.tobytes()),
                    nonce=nonce,
                ),
            )
        except BaseException:
            self.transfer.unstage(staging, None)  # nothing was sent: nobody can write it
            raise
        nbytes = (end - skip) * staging.layout.slot_bytes * 2 * len(staging.layout.k_ptrs)
        self.pulled[boot.room] = _Pulled(req, now + self.timeout, now, nbytes, staging, nonce, peer)

    def poll(self) -> tuple[list[tuple[Req, KVDone]], list[Req]]:
        """Handle notifications and replies. Returns the requests whose KV is here (with the
        prefill worker's KVDone: the first token; their prompt is in the radix cache now) and those that
        ended (KV failed or timed out); an ended request's staging buffer is dropped once
        nothing can still write it."""
        arrived: list[tuple[Req, KVDone]] = []
        ended: list[Req] = []
        for agent, raw in self.transfer.notifications():  # all: NIXL hands each over once
            self._on_done(agent, raw, arrived, ended)
        for peer, sock in self.socks.items():
            for _ in range(MESSAGES_PER_STEP):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self._on_reply(peer, frames, ended)
        now = time.monotonic()
        for room, p in list(self.pulled.items()):
            if now <= p.deadline:
                continue
            if p.ended:  # the prefill worker never answered the cancel: it is gone
                self._drop(room)
            else:
                message = (
                    f"the KV of room {room} did not arrive from the prefill worker "
                    f"{p.peer[0]}:{p.peer[1]} within {self.timeout:g} s"
                )
                ended.append(self._end(room, message, 504))
        return arrived, ended

    def _on_reply(self, peer: tuple[str, int], frames: list[bytes], ended: list[Req]) -> None:
        """A KVFailed or KVCancelled from `peer`, for a room pulled from that peer."""
        msg = self.codec.to_decode(frames)
        p = self.pulled.get(msg.room) if msg is not None else None
        if msg is not None and p is None and msg.room in self.finished:
            return  # a late answer for a room that ended here
        if msg is None or p is None or p.peer != peer:
            reject(self.stats, "a KV reply not signed with the PD secret, or from a peer that was not pulled")
            return
        room = msg.room
        self._drop(room)
        if p.ended:
            return
        self.stats.kv_transfer_failures += 1
        self.kv.release(p.req)
        why = msg.message if isinstance(msg, KVFailed) else "it cancelled the transfer"
        ended.append(_abort(p.req, f"the prefill worker could not send the KV: {why}", 502))

    def _on_done(self, agent: str, raw: bytes, arrived: list[tuple[Req, KVDone]], ended: list[Req]) -> None:
        """A transfer's notification: signed, from the agent it names, with its room's nonce."""
        msg = self.codec.done(raw)
        p = self.pulled.get(msg.room) if msg is not None else None
        if msg is None or p is None or msg.agent != agent or not hmac.compare_digest(msg.nonce, p.nonce):
            reject(
                self.stats,
                "a KV notification not signed with the PD secret, from another agent, or without its pull's nonce",
            )
            return
        room = msg.room
        if p.ended:
            self._drop(room)
            return
        req = p.req
        if msg.kv_len != req.seq_len:
            self._drop(room)
            self.kv.release(req)
            ended.append(
                _abort(
                    req, f"the prefill worker computed {msg.kv_len} positions, this worker expected {req.seq_len}", 502
                )
            )
            return
        slots = torch.from_numpy(self.kv.slots(req, req.kv_len, req.seq_len).astype("int64"))
        del self.pulled[room]
        self._finished(room)
        self.transfer.unstage(p.staging, slots)
        self.stats.kv_transfers += 1
        self.stats.kv_transfer_bytes += p.nbytes
        self.stats.kv_transfer_seconds += time.monotonic() - p.since
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
        """End a pulled request now and free its slots (the peer writes only into staging);
        keep its staging buffer until the prefill worker confirms it will not write it (or one
        more timeout passes)."""
        p = self.pulled[room]
        p.ended, p.deadline = True, time.monotonic() + self.timeout
        self.kv.release(p.req)
        self._send(p.peer, KVCancel(room=room))
        return _abort(p.req, message, status)

    def _drop(self, room: int) -> None:
        """Forget a pull whose staging buffer nothing will write any more."""
        self.transfer.unstage(self.pulled.pop(room).staging, None)
        self._finished(room)

    def _finished(self, room: int) -> None:
        self.finished[room] = None
        while len(self.finished) > FINISHED_ROOMS:
            self.finished.popitem(last=False)

    def _send(self, peer: tuple[str, int], msg: KVPull | KVCancel) -> None:
        waiting = {p.peer for p in self.pulled.values()}
        sock = self.socks.get(peer, waiting.__contains__)
        try:
            sock.send_multipart(self.codec.encode(msg), zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("the bootstrap socket of %s:%d is full; dropped a %s", *peer, type(msg).__name__)

    def close(self) -> None:
        self.socks.close()
        for p in self.pulled.values():
            self.transfer.unstage(p.staging, None)
        self.transfer.close()
        self.ctx.term()


def _abort(req: Req, message: str, status: int) -> Req:
    req.finish_reason = FinishAbort(message=message, status_code=status)
    return req
