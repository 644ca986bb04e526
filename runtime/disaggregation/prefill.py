"""The prefill worker's side: hold each finished prefill's KV until its decode worker asks for
it, write it there, then let the request end (its prompt stays in this worker's radix cache)."""

from __future__ import annotations

import logging
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import zmq

from arbor.runtime.config import DisaggArgs
from arbor.runtime.disaggregation.protocol import (
    BootstrapCodec,
    KVCancel,
    KVCancelled,
    KVDone,
    KVFailed,
    KVPull,
    reject,
)
from arbor.runtime.disaggregation.role import NullRole
from arbor.runtime.disaggregation.secret import MAC_BYTES, MAX_FRAME_BYTES
from arbor.runtime.disaggregation.transfer import make_transfer
from arbor.runtime.io.messages import FinishAbort, FinishLength
from arbor.runtime.kv.manager import KVManager
from arbor.runtime.kv.pool import KVPool
from arbor.runtime.scheduler.req import Req
from arbor.runtime.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)
REMEMBERED_ROOMS = 4096  # ended rooms kept to answer a late pull or cancel
MESSAGES_PER_STEP = 256  # a flood of bootstrap messages cannot stall the scheduler's step


@dataclass(eq=False)
class _Held:
    req: Req
    room: int  # the request's bootstrap room
    since: float
    peer: bytes = b""  # the decode worker's socket identity, once it pulled
    handle: Any = None
    started: float = 0.0
    nbytes: int = 0
    cancelled: bool = False


class PrefillSender(NullRole):
    """Serves `KVPull`s on the bootstrap port (tcp, --host:--disaggregation-bootstrap-port).
    Every message there must be signed with the PD secret and well formed; any other is
    dropped and counted (`bootstrap_rejected`), and never ends the worker."""

    def __init__(
        self, disagg: DisaggArgs, host: str, kv: KVManager, pool: KVPool, stats: SchedulerStats, secret: str
    ) -> None:
        self.transfer = make_transfer(disagg.transfer_backend, pool, "prefill", host, disagg.ib_device)
        self.kv = kv
        self.codec = BootstrapCodec(secret)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES + MAC_BYTES)  # a bigger frame drops its peer
        self.sock.bind(f"tcp://{host}:{disagg.bootstrap_port}")
        self.timeout = disagg.timeout_s
        self.stats = stats
        self.held: dict[int, _Held] = {}
        self.pulls: dict[int, tuple[bytes, KVPull]] = {}  # pulls that came before their request finished
        self.gone: OrderedDict[int, str] = OrderedDict()  # room -> why it ended without a transfer
        self.sockets = [self.sock]

    @property
    def busy(self) -> bool:
        return bool(self.held) or bool(self.sock.poll(0))

    def keeps(self, req: Req) -> bool:
        """A disaggregated request ends here at its first token (max_new_tokens aside); its KV
        (the request stays attached) is kept until its transfer ends."""
        if req.bootstrap is None or isinstance(req.finish_reason, FinishAbort):
            return False
        req.finish_reason = req.finish_reason or FinishLength(length=len(req.output_ids))
        self.held[req.bootstrap.room] = _Held(req, req.bootstrap.room, time.monotonic())
        return True

    def ended(self, req: Req) -> None:
        """A request that ended before its prefill did: a pull for it gets KVFailed."""
        if req.bootstrap is None or req.bootstrap.room in self.held:
            return
        assert isinstance(req.finish_reason, FinishAbort)  # the scheduler calls `ended` for aborts only
        room, message = req.bootstrap.room, f"the prefill worker ended the request: {req.finish_reason.message}"
        self._forget(room, message)
        if room in self.pulls:
            self._reply(self.pulls.pop(room)[0], KVFailed(room=room, message=message))

    def step(self, capacity: int) -> tuple[list[Req], list[tuple[Req, KVDone]]]:
        """Answer pulls and cancels, start and check transfers; a request whose transfer is
        over ends, its KV freed into the radix cache."""
        self._drain()
        ended, now = [], time.monotonic()
        for room, h in list(self.held.items()):
            if h.handle is None and h.cancelled:
                self._reply(h.peer, KVCancelled(room=room))
                ended.append(self._end(h, "the decode worker cancelled the request", 499))
            elif h.handle is None and room in self.pulls:
                h.peer, pull = self.pulls.pop(room)
                ended += self._start(h, pull)
            elif h.handle is None and now - h.since > self.timeout:
                ended.append(
                    self._end(h, f"no decode worker asked for the KV of room {room} within {self.timeout:g} s", 504)
                )
            elif h.handle is not None:
                ended += self._check(h, now)
        return ended, []

    def _drain(self) -> None:
        for _ in range(MESSAGES_PER_STEP):
            try:
                peer, *frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = self.codec.to_prefill(frames)
            if msg is None:
                reject(self.stats, "a bootstrap message that was not signed with the PD secret or was malformed")
                continue
            held = self.held.get(msg.room)
            if isinstance(msg, KVCancel):
                if held is not None:
                    held.cancelled, held.peer = True, held.peer or peer
                else:
                    self._forget(msg.room, "cancelled by the decode worker")
                    self.pulls.pop(msg.room, None)
                    self._reply(peer, KVCancelled(room=msg.room))
            elif msg.room in self.gone:
                self._reply(peer, KVFailed(room=msg.room, message=self.gone[msg.room]))
            else:
                self.pulls[msg.room] = (peer, msg)
                while len(self.pulls) > REMEMBERED_ROOMS:  # pulls whose request never came here
                    self.pulls.pop(next(iter(self.pulls)))

    def _start(self, h: _Held, pull: KVPull) -> list[Req]:
        req = h.req
        fill = req.fill_ids()[: req.kv_len]
        problem = self.transfer.check_peer(pull.layout)
        if problem is None and (pull.kv_len != req.kv_len or pull.tokens_crc != zlib.crc32(fill.tobytes())):
            problem = (
                f"the decode worker holds a different prompt for room {pull.room} ({pull.kv_len} positions, "
                f"this worker {req.kv_len}): do both workers serve the same model and tokenizer?"
            )
        if problem is not None:
            self._reply(h.peer, KVFailed(room=pull.room, message=problem))
            return [self._end(h, problem, 502)]
        src = self.kv.slots(req, pull.skip, req.kv_len)  # pull_problem checked skip <= kv_len
        notif = self.codec.encode_done(_done_message(req, pull, self.transfer.name))
        try:
            h.handle, h.nbytes = self.transfer.write(pull.layout, src, notif)
        except Exception as exc:
            message = f"the KV transfer of room {pull.room} could not start: {exc}"
            self._reply(h.peer, KVFailed(room=pull.room, message=message))
            return [self._end(h, message, 502)]
        h.started = time.monotonic()
        if h.handle is None:  # the decode worker had the whole prompt cached
            return [self._done(h)]
        return []

    def _check(self, h: _Held, now: float) -> list[Req]:
        state = self.transfer.state(h.handle)
        if state == "DONE":
            self.transfer.release(h.handle)
            return [self._done(h)]
        if state == "PROC" and now - h.started <= self.timeout:
            return []
        room = h.room
        why = "failed" if state != "PROC" else f"did not finish within {self.timeout:g} s"
        message = f"the KV transfer of room {room} to the decode worker {why}"
        self.transfer.release(h.handle)
        self._reply(h.peer, KVFailed(room=room, message=message))
        return [self._end(h, message, 502)]

    def _done(self, h: _Held) -> Req:
        del self.held[h.room]
        self.stats.kv_transfers += 1
        self.stats.kv_transfer_bytes += h.nbytes
        self.stats.kv_transfer_seconds += time.monotonic() - h.started
        self.kv.release(h.req)
        return h.req

    def _end(self, h: _Held, message: str, status: int) -> Req:
        room = h.room
        del self.held[room]
        self._forget(room, message)
        self.stats.kv_transfer_failures += 1
        h.req.finish_reason = FinishAbort(message=message, status_code=status)
        self.kv.release(h.req)
        return h.req

    def _forget(self, room: int, why: str) -> None:
        self.gone[room] = why
        while len(self.gone) > REMEMBERED_ROOMS:
            self.gone.popitem(last=False)

    def _reply(self, peer: bytes, msg: KVFailed | KVCancelled) -> None:
        if peer:
            try:
                self.sock.send_multipart([peer, *self.codec.encode(msg)], zmq.NOBLOCK)
            except zmq.ZMQError:  # the peer is gone or not reading: it learns by its timeout
                logger.warning("could not answer room %d's decode worker", msg.room)

    def abort(self, rid: str) -> list[Req]:
        """End held requests of `rid` whose transfer has not started (one in flight finishes)."""
        ended = []
        for h in [h for h in self.held.values() if rid in (h.req.rid, h.req.group) and h.handle is None]:
            self._reply(h.peer, KVFailed(room=h.room, message="the prefill request was aborted"))
            ended.append(self._end(h, "aborted", 499))
        return ended

    def close(self) -> None:
        self.sock.close()
        self.transfer.close()
        self.ctx.term()


def _done_message(req: Req, pull: KVPull, agent: str) -> KVDone:
    """The notification that follows the KV: the pull's nonce, the first token after it and,
    when asked for, its logprobs."""
    i = req.kv_len - len(req.origin_ids)
    done = KVDone(room=pull.room, nonce=pull.nonce, agent=agent, kv_len=req.kv_len, token=req.output_ids[i])
    if req.return_logprob and len(req.logprobs) > i:
        done.logprob = req.logprobs[i]
        done.top_logprobs = req.top_logprobs[i] if len(req.top_logprobs) > i else []
    return done
