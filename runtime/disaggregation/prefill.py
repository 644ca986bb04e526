"""The prefill worker's side: hold each finished prefill's KV until its decode worker asks for
it, write it there, then let the request end (its prompt stays in this worker's radix cache)."""

from __future__ import annotations

import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    ToPrefill,
)
from arbor.runtime.disaggregation.transfer import make_transfer
from arbor.runtime.memory import KVPool
from arbor.runtime.messages import FinishAbort, ReqOut
from arbor.runtime.scheduler.kv_manager import KVManager
from arbor.runtime.scheduler.req import Req

logger = logging.getLogger(__name__)
REMEMBERED_ROOMS = 4096  # ended rooms kept to answer a late pull or cancel


@dataclass(eq=False)
class _Held:
    req: Req
    since: float
    peer: bytes = b""  # the decode worker's socket identity, once it pulled
    handle: Any = None
    started: float = 0.0
    nbytes: int = 0
    cancelled: bool = False


class PrefillSender:
    """Serves `KVPull`s on the bootstrap port (tcp, --host:--disaggregation-bootstrap-port)."""

    def __init__(self, args: ServerArgs, kv: KVManager, pool: KVPool, ctx: zmq.Context,
                 counters: dict[str, float]) -> None:
        self.transfer = make_transfer(args.disaggregation_transfer_backend, pool, "prefill")
        self.kv = kv
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://{args.host}:{args.disaggregation_bootstrap_port}")
        self.timeout = args.disaggregation_timeout_s
        self.counters = counters
        self.held: dict[int, _Held] = {}
        self.pulls: dict[int, tuple[bytes, KVPull]] = {}  # pulls that came before their request finished
        self.ended: OrderedDict[int, str] = OrderedDict()  # room -> why it ended without a transfer
        self._decoder = msgspec.msgpack.Decoder(ToPrefill)
        self._encoder = msgspec.msgpack.Encoder()

    @property
    def busy(self) -> bool:
        """Whether a request waits on a transfer, or a decode worker's message waits here."""
        return bool(self.held) or bool(self.sock.poll(0))

    def hold(self, req: Req) -> None:
        """Keep a finished prefill's KV (the request stays attached) until its transfer ends."""
        self.held[req.bootstrap.room] = _Held(req, time.monotonic())

    def poll(self, finish: Callable[[Req], ReqOut]) -> list[ReqOut]:
        """Answer pulls and cancels, start and check transfers; end the requests whose
        transfer is over with `finish` (which frees their KV into the radix cache)."""
        self._drain()
        outs, now = [], time.monotonic()
        for room, h in list(self.held.items()):
            if h.handle is None and h.cancelled:
                self._reply(h.peer, KVCancelled(room=room))
                outs.append(self._end(h, finish, "the decode worker cancelled the request", 499))
            elif h.handle is None and room in self.pulls:
                h.peer, pull = self.pulls.pop(room)
                outs += self._start(h, pull, finish)
            elif h.handle is None and now - h.since > self.timeout:
                outs.append(self._end(h, finish, f"no decode worker asked for the KV of room {room} within "
                                                  f"{self.timeout:g} s", 504))
            elif h.handle is not None:
                outs += self._check(h, finish, now)
        return outs

    def _drain(self) -> None:
        while True:
            try:
                peer, frame = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = self._decoder.decode(frame)
            except msgspec.DecodeError:
                logger.warning("ignored a malformed message on the bootstrap port")
                continue
            held = self.held.get(msg.room)
            if isinstance(msg, KVCancel):
                if held is not None:
                    held.cancelled, held.peer = True, held.peer or peer
                else:
                    self._forget(msg.room, "cancelled by the decode worker")
                    self.pulls.pop(msg.room, None)
                    self._reply(peer, KVCancelled(room=msg.room))
            elif msg.room in self.ended:
                self._reply(peer, KVFailed(room=msg.room, message=self.ended[msg.room]))
            else:
                self.pulls[msg.room] = (peer, msg)
                while len(self.pulls) > REMEMBERED_ROOMS:  # pulls whose request never came here
                    self.pulls.pop(next(iter(self.pulls)))

    def _start(self, h: _Held, pull: KVPull, finish: Callable[[Req], ReqOut]) -> list[ReqOut]:
        req = h.req
        fill = req.fill_ids()[: req.kv_len]
        problem = self.transfer.check_peer(pull.layout)
        if problem is None and (pull.kv_len != req.kv_len or pull.tokens_crc != zlib.crc32(fill.tobytes())):
            problem = (f"the decode worker holds a different prompt for room {pull.room} ({pull.kv_len} positions, "
                       f"this worker {req.kv_len}): do both workers serve the same model and tokenizer?")
        if problem is None and not 0 <= pull.skip <= req.kv_len:
            problem = f"the pull for room {pull.room} skips {pull.skip} of {req.kv_len} positions"
        if problem is None:
            src = self.kv.slots(req, pull.skip, req.kv_len)
            dst = np.frombuffer(pull.dst_slots, dtype=np.int32)
            if len(dst) != len(src):
                problem = f"the pull for room {pull.room} names {len(dst)} slots for {len(src)} positions"
        if problem is not None:
            self._reply(h.peer, KVFailed(room=pull.room, message=problem))
            return [self._end(h, finish, problem, 502)]
        token = req.output_ids[req.kv_len - len(req.origin_ids)]
        notif = self._encoder.encode(KVDone(room=pull.room, kv_len=req.kv_len, token=token))
        try:
            h.handle, h.nbytes = self.transfer.write(pull.layout, src, dst, notif)
        except Exception as exc:
            message = f"the KV transfer of room {pull.room} could not start: {exc}"
            self._reply(h.peer, KVFailed(room=pull.room, message=message))
            return [self._end(h, finish, message, 502)]
        h.started = time.monotonic()
        if h.handle is None:  # the decode worker had the whole prompt cached
            return [self._done(h, finish)]
        return []

    def _check(self, h: _Held, finish: Callable[[Req], ReqOut], now: float) -> list[ReqOut]:
        state = self.transfer.state(h.handle)
        if state == "DONE":
            self.transfer.release(h.handle)
            return [self._done(h, finish)]
        if state == "PROC" and now - h.started <= self.timeout:
            return []
        room = h.req.bootstrap.room
        why = "failed" if state != "PROC" else f"did not finish within {self.timeout:g} s"
        message = f"the KV transfer of room {room} to the decode worker {why}"
        self.transfer.release(h.handle)
        self._reply(h.peer, KVFailed(room=room, message=message))
        return [self._end(h, finish, message, 502)]

    def _done(self, h: _Held, finish: Callable[[Req], ReqOut]) -> ReqOut:
        del self.held[h.req.bootstrap.room]
        self.counters["kv_transfers"] += 1
        self.counters["kv_transfer_bytes"] += h.nbytes
        self.counters["kv_transfer_seconds"] += time.monotonic() - h.started
        return finish(h.req)

    def _end(self, h: _Held, finish: Callable[[Req], ReqOut], message: str, status: int) -> ReqOut:
        room = h.req.bootstrap.room
        del self.held[room]
        self._forget(room, message)
        self.counters["kv_transfer_failures"] += 1
        h.req.finish_reason = FinishAbort(message=message, status_code=status)
        return finish(h.req)

    def _forget(self, room: int, why: str) -> None:
        self.ended[room] = why
        while len(self.ended) > REMEMBERED_ROOMS:
            self.ended.popitem(last=False)

    def _reply(self, peer: bytes, msg: Any) -> None:
        if peer:
            self.sock.send_multipart([peer, self._encoder.encode(msg)])

    def abort(self, rid: str, finish: Callable[[Req], ReqOut]) -> list[ReqOut]:
        """End held requests of `rid` whose transfer has not started (one in flight finishes)."""
        outs = []
        for h in [h for h in self.held.values() if rid in (h.req.rid, h.req.group) and h.handle is None]:
            self._reply(h.peer, KVFailed(room=h.req.bootstrap.room, message="the prefill request was aborted"))
            outs.append(self._end(h, finish, "aborted", 499))
        return outs

    def close(self) -> None:
        self.sock.close()
        self.transfer.close()
