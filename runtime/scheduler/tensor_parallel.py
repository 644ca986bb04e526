"""Tensor-parallel lockstep: rank 0 runs the Scheduler (radix tree, KV bookkeeping, grammar,
sampling); before each forward it sends the batch to ranks 1..N-1, which run the same forward
on their shard of the model. The collectives inside the forward (gloo on CPUs, NCCL on GPUs)
join the ranks; the batches travel as typed msgspec messages over ZMQ, never pickled.

A batch carries its KV slots (`out_cache_loc`) and the slot rows it reads (`kv_indices`), so
every rank's KV pool holds its heads of each token at the same slot as rank 0's: one layout,
chosen by rank 0's radix tree and allocator alone.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import msgspec
import numpy as np
import torch
import torch.distributed as dist
import zmq

from arbor.runtime.config import ParallelArgs, ServerArgs
from arbor.runtime.io.ipc import Puller, Pusher
from arbor.runtime.io.processes import tp_endpoint
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.parallel import TensorParallel
from arbor.runtime.model.ragged import indptr, ragged_cells
from arbor.runtime.model.runner import ModelRunner

logger = logging.getLogger("arbor.tp")
COLLECTIVE_TIMEOUT_S = 120  # a collective that waits longer means a rank is gone
IDLE_POLL_MS = 1000
# ForwardBatch's per-token and per-request tensors, in the order they are packed
FIELDS = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens", "prefix_lens", "extend_lens")


class TpSetup(msgspec.Struct, tag=True):
    """Rank 0's KV capacity, which every rank allocates (sized once, from rank 0's memory)."""

    num_slots: int


class TpBatch(msgspec.Struct, tag=True):
    """One forward: FIELDS then kv_indices, int64, concatenated (`sizes` splits them)."""

    mode: str
    all_logits: bool
    sizes: list[int]
    data: bytes


class TpStop(msgspec.Struct, tag=True):
    """Rank 0 is shutting down."""


TpMsg = TpSetup | TpBatch | TpStop


def share_cores(parallel: ParallelArgs) -> None:
    """Give this rank's torch --num-threads, or with several ranks an equal share of the cores."""
    if parallel.num_threads is not None:
        torch.set_num_threads(parallel.num_threads)
    elif parallel.tp_size > 1 and not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // parallel.tp_size))


def init_rank(parallel: ParallelArgs, device: str, rank: int, port: int) -> TensorParallel:
    """Join the process group on `device` (--device; the caller has set this rank's threads
    with share_cores)."""
    backend = "nccl" if torch.cuda.is_available() and device != "cpu" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=parallel.tp_size,
        timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    return TensorParallel(rank, parallel.tp_size)


class TpLeader:
    """Rank 0's side: sends each forward batch to every other rank."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], endpoints: dict[str, str], size: int) -> None:
        self.peers = [Pusher(ctx, endpoints[tp_endpoint(r)]) for r in range(1, size)]

    def setup(self, num_slots: int) -> None:
        self._send(TpSetup(num_slots=num_slots))

    def __call__(self, batch: ForwardBatch) -> None:
        tensors = [getattr(batch, f) for f in FIELDS] + [batch.kv_indices]
        flat = torch.cat([t.to("cpu", torch.int64) for t in tensors])
        self._send(
            TpBatch(
                mode=batch.mode.value,
                all_logits=batch.return_all_logits,
                sizes=[t.numel() for t in tensors],
                data=flat.numpy().tobytes(),
            )
        )

    def close(self) -> None:
        self._send(TpStop())
        for p in self.peers:
            p.sock.setsockopt(zmq.LINGER, 1000)
            p.close()

    def _send(self, msg: msgspec.Struct) -> None:
        for p in self.peers:
            p.send(msg)


def rebuild(msg: TpBatch, runner: ModelRunner) -> ForwardBatch:
    """A follower's copy of rank 0's batch; writes the rows it reads into this rank's
    request-to-slot table, so the attention reads the same slots rank 0 does."""
    device = runner.device
    flat = torch.from_numpy(np.frombuffer(msg.data, dtype=np.int64).copy()).to(device)
    parts = dict(zip((*FIELDS, "kv_indices"), torch.split(flat, msg.sizes)))
    seq = parts["seq_lens"]
    table = runner.req_to_token.table
    table[ragged_cells(parts["req_pool_indices"], torch.zeros_like(seq), seq)] = parts["kv_indices"].to(table.dtype)
    return ForwardBatch(
        mode=ForwardMode(msg.mode),
        input_ids=parts["input_ids"],
        positions=parts["positions"],
        out_cache_loc=parts["out_cache_loc"],
        req_pool_indices=parts["req_pool_indices"],
        seq_lens=seq,
        prefix_lens=parts["prefix_lens"],
        extend_lens=parts["extend_lens"],
        qo_indptr=indptr(parts["extend_lens"]),
        kv_indptr=indptr(seq),
        req_to_token=table,
        return_all_logits=msg.all_logits,
    )


def run_follower(args: ServerArgs, model_path: str, endpoints: dict[str, str], rank: int, port: int) -> None:
    """Process entry of ranks 1..N-1: load this rank's shard, then mirror rank 0's forwards
    until it stops or the parent process dies."""
    logging.basicConfig(level=args.log_level.upper(), format=f"[tp rank {rank}] %(levelname)s %(message)s")
    ctx = zmq.Context()
    inbox = Puller(ctx, endpoints[tp_endpoint(rank)], TpMsg)
    parent = os.getppid()
    try:
        share_cores(args.parallel)
        tp = init_rank(args.parallel, args.model.device, rank, port)
        setup = _next(inbox, parent)
        if not isinstance(setup, TpSetup):
            return
        runner = ModelRunner(
            args.model, args.cache, args.scheduler.max_running_requests, model_path, tp=tp, num_slots=setup.num_slots
        )
        while isinstance(msg := _next(inbox, parent), TpBatch):
            runner.forward(rebuild(msg, runner))
    finally:
        inbox.close()
        ctx.term()
        if dist.is_initialized():
            dist.destroy_process_group()


def _next(inbox: Puller, parent: int) -> TpMsg | None:
    """The next message from rank 0; None once the parent process is gone."""
    while True:
        msg: TpMsg | None = inbox.recv(timeout_ms=IDLE_POLL_MS)
        if msg is not None:
            return msg
        if os.getppid() != parent:
            logger.warning("the parent process is gone; exiting")
            return None
