"""The scheduler process: receive requests, step the Scheduler, send token outputs.

The loop drains the inbox (new requests, aborts, cache flushes, stats requests), then runs one
`Scheduler.step()` while there is work: a planned prefill, mixed or decode step (speculative
when a proposer is configured), after moving on compiled grammars and, on a disaggregated
worker, KV transfers. Idle, it blocks on the inbox and its role's sockets; with only grammars
compiling it polls. It checks the KV slot invariant each time the work runs out.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch.distributed
import zmq

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.heartbeat import Heartbeat
from arbor.runtime.io.ipc import Puller, Pusher
from arbor.runtime.io.messages import (
    AbortReq,
    BatchTokenOut,
    FlushCacheReq,
    ProcessError,
    Ready,
    ShutdownReq,
    Stats,
    StatsReq,
    TokenizedGenerateReq,
    ToScheduler,
)
from arbor.runtime.model.parallel import SINGLE
from arbor.runtime.scheduler.scheduler import Scheduler
from arbor.runtime.scheduler.tensor_parallel import TpLeader, init_rank, share_cores

logger = logging.getLogger("arbor.scheduler")
IDLE_POLL_MS = 1000
GRAMMAR_POLL_MS = 2


def run_scheduler(
    args: ServerArgs,
    model_path: str,
    tokenizer_path: str,
    endpoints: dict[str, str],
    heartbeat: Heartbeat,
    tp_port: int = 0,
) -> None:
    """Process entry: load the model, announce readiness, then loop until shut down, beating
    `heartbeat` each time the loop comes around. With --tp-size N this is rank 0, and
    `tp_port` the process group's rendezvous port."""
    logging.basicConfig(level=args.log_level.upper(), format="[scheduler] %(levelname)s %(message)s")
    ctx = zmq.Context()
    inbox = Puller(ctx, endpoints["scheduler"], ToScheduler)
    out = Pusher(ctx, endpoints["detokenizer"])
    leader = TpLeader(ctx, endpoints, args.parallel.tp_size) if args.parallel.tp_size > 1 else None
    try:
        share_cores(args.parallel)
        tp = init_rank(args.parallel, args.model.device, 0, tp_port) if leader is not None else SINGLE
        sched = Scheduler(args, model_path, tokenizer_path, tp, leader)
    except Exception as exc:  # e.g. a bad checkpoint: the front door reports this message
        _report(ctx, endpoints, exc)
        inbox.close()
        out.close()
        if leader is not None:
            leader.close()
        ctx.term()  # flushes the report
        raise SystemExit(1) from None
    runner = sched.runner
    out.send(
        Ready(
            process="scheduler",
            info={
                "max_total_tokens": runner.allocator.total_slots,
                "context_length": runner.context_len,
                "kv_cache_dtype": str(runner.kv_dtype).removeprefix("torch."),
                "vocab_size": runner.config.vocab_size,
                "max_running_requests": args.scheduler.max_running_requests,
            },
        )
    )
    try:
        _loop(sched, inbox, out, os.getppid(), heartbeat)
    except Exception as exc:
        logger.exception("scheduler loop failed")
        _report(ctx, endpoints, exc)
        raise SystemExit(1) from None
    finally:
        sched.close()
        inbox.close()
        out.close()
        if leader is not None:
            leader.close()
            torch.distributed.destroy_process_group()
        ctx.term()


def _report(ctx: zmq.Context[zmq.Socket[bytes]], endpoints: dict[str, str], exc: Exception) -> None:
    """Send a failure straight to the front door (bound before any child starts), waiting
    up to 2 s for it to leave."""
    front = Pusher(ctx, endpoints["front"])
    front.send(ProcessError(process="scheduler", message=f"{type(exc).__name__}: {exc}"))
    front.sock.setsockopt(zmq.LINGER, 2000)
    front.close()


def _loop(sched: Scheduler, inbox: Puller, out: Pusher, parent: int, heartbeat: Heartbeat) -> None:
    checked_idle = True
    while True:
        heartbeat.beat()
        msgs: list[Any] | None
        if sched.busy:
            msgs = inbox.drain()
        elif sched.has_work:  # only grammars compiling: poll, do not spin
            msg = inbox.recv(timeout_ms=GRAMMAR_POLL_MS)
            msgs = [] if msg is None else [msg, *inbox.drain()]
        else:
            msgs = _wait(inbox, parent, sched.wake_sockets(), heartbeat)
        if msgs is None:
            return
        outs = []
        for msg in msgs:
            if isinstance(msg, TokenizedGenerateReq):
                outs += sched.add(msg)
            elif isinstance(msg, AbortReq):
                outs += sched.abort(msg.rid)
            elif isinstance(msg, FlushCacheReq):
                sched.flush_cache()
            elif isinstance(msg, StatsReq):
                out.send(Stats(values=_stats(sched)))
            elif isinstance(msg, ShutdownReq):
                out.send(ShutdownReq())
                return
        if sched.has_work:
            outs += sched.step()
            checked_idle = False
        if outs:
            out.send(BatchTokenOut(outs=outs))
        if not sched.has_work and not checked_idle:
            checked_idle = True
            problem = sched.check_invariant()
            if problem:
                logger.error("INVARIANT VIOLATED: %s", problem)


def _wait(inbox: Puller, parent: int, others: list[zmq.Socket[bytes]], heartbeat: Heartbeat) -> list[Any] | None:
    """Block until messages arrive (an empty list when only `others`, the scheduler's own
    sockets, have some); None once the parent process is gone. Idle is progress: it beats."""
    poller = zmq.Poller()
    for sock in (inbox.sock, *others):
        poller.register(sock, zmq.POLLIN)
    while True:
        heartbeat.beat()
        ready = dict(poller.poll(IDLE_POLL_MS))
        if inbox.sock in ready:
            return inbox.drain()
        if ready:
            return []
        if os.getppid() != parent:
            return None


def _stats(sched: Scheduler) -> dict[str, float]:
    """The scheduler's totals and gauges, by the names /metrics and the stats message use."""
    stats = sched.stats
    values = stats.as_floats()
    values.update(
        running=len(sched.running),
        waiting=len(sched.waiting) + sched.awaiting_kv,
        free_slots=sched.kv.allocator.available(),
        total_slots=sched.kv.allocator.total_slots,
        new_token_ratio=sched.admission.new_token_ratio,
        invariant_ok=float(sched.check_invariant() is None) if not sched.has_work else 1.0,
    )
    # Admitted requests only (the tree's own lookups, e.g. LPM ordering, are not user traffic).
    values["cache_hit_rate"] = stats.cached_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
    spec = stats.spec_request_steps
    values["spec_accept_length"] = 1 + stats.spec_accepted_tokens / spec if spec else 0.0
    values["cache_tokens"] = sched.kv.cache.total_size()
    if sched.runner.tp.size > 1:
        values["tp_collective_s"] = sched.runner.tp.collective_s
    return values
