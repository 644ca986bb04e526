"""KV transfer engines: a prefill worker writes one room's KV into a staging buffer that its
decode worker registered for that room alone, and the decode worker copies it into its pool.

Why staging: a peer that holds a registration's metadata can read and write all of it. The
pool holds every tenant's KV, so it is never registered on the decode side; a room's staging
buffer holds only that room's prompt, and is deregistered once its transfer ends.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from arbor.runtime.disaggregation.interfaces import ucx_devices
from arbor.runtime.disaggregation.protocol import PoolLayout
from arbor.runtime.kv.pool import KVPool

logger = logging.getLogger(__name__)


def slot_runs(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split a slot-to-slot copy into runs consecutive on both sides: (src starts, dst starts, lengths)."""
    if len(src) == 0:
        return src, dst, src
    cut = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate(([0], cut))
    lengths = np.diff(np.concatenate((starts, [len(src)])))
    return src[starts], dst[starts], lengths


@dataclass(eq=False)
class Staging:
    """One room's staging buffer on a decode worker: [2 (K, V), layers, rows, slot bytes]."""

    buffer: torch.Tensor
    registered: Any
    layout: PoolLayout


class NixlTransfer:
    """NIXL (UCX backend: host memory over TCP or shared memory here, RDMA where the machine has
    it). UCX uses only the network devices `ucx_devices` names, so it listens no wider than asked."""

    def __init__(self, pool: KVPool, role: str, host: str, device: str | None) -> None:
        try:
            from nixl._api import nixl_agent, nixl_agent_config
        except ImportError as exc:
            raise RuntimeError(
                "--disaggregation-transfer-backend nixl needs the nixl package: pip install 'arbor[pd]' (nixl 1.5)"
            ) from exc
        devices = ucx_devices(host, device)
        if devices is not None:  # read by UCX when the agent starts
            os.environ["UCX_NET_DEVICES"] = devices
        self.pool = pool
        self.name = f"arbor-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # No progress thread: NIXL's spins a whole core, half of a one-core worker's forward
        # (bench_pd). Transfers progress when the scheduler polls their state between steps.
        self.agent = nixl_agent(self.name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        first = pool.k[0]
        self.slot_bytes = first[0].numel() * first.element_size()
        self.mem_type = "VRAM" if first.is_cuda else "DRAM"
        self.device_id = first.device.index or 0
        # The prefill side reads its own pool; its registration's metadata is never sent anywhere.
        self.registered = self.agent.register_memory(pool.k + pool.v) if role == "prefill" else None

    def check_peer(self, peer: PoolLayout) -> str | None:
        """Why this pool cannot write into `peer`'s staging buffer, or None."""
        if len(peer.k_ptrs) != len(self.pool.k) or peer.slot_bytes != self.slot_bytes:
            return (
                f"the decode worker's KV pool has {len(peer.k_ptrs)} layers of {peer.slot_bytes} bytes a token, "
                f"this prefill worker's {len(self.pool.k)} of {self.slot_bytes}: serve the same model with "
                "the same --kv-cache-dtype and --tp-size on both"
            )
        return None

    # --- decode side ---------------------------------------------------------------------------

    def stage(self, rows: int) -> Staging:
        """A staging buffer for `rows` tokens, registered alone; its layout goes in the pull."""
        layers = len(self.pool.k)
        # Zeroed: a peer that reads its room's buffer must find nothing of this process's past in it.
        buffer = torch.zeros(
            (2, layers, max(rows, 1), self.slot_bytes), dtype=torch.uint8, device=self.pool.k[0].device
        )
        registered = self.agent.register_memory([buffer])
        metadata = self.agent.get_partial_agent_metadata(registered, inc_conn_info=True, backends=["UCX"])
        layout = PoolLayout(
            agent=self.name,
            metadata=metadata,
            k_ptrs=[buffer[0, i].data_ptr() for i in range(layers)],
            v_ptrs=[buffer[1, i].data_ptr() for i in range(layers)],
            slot_bytes=self.slot_bytes,
            slots=rows,
            mem_type=self.mem_type,
            device_id=self.device_id,
        )
        return Staging(buffer, registered, layout)

    def unstage(self, staging: Staging, slots: torch.Tensor | None) -> None:
        """Deregister `staging`; with `slots`, first copy its rows into those pool slots."""
        self.agent.deregister_memory(staging.registered)
        if slots is None or len(slots) == 0:
            return
        index = slots.to(device=staging.buffer.device, dtype=torch.long)
        rows = len(index)
        for layer, (k, v) in enumerate(zip(self.pool.k, self.pool.v)):
            _words(k).index_copy_(0, index, _words(staging.buffer[0, layer, :rows]))
            _words(v).index_copy_(0, index, _words(staging.buffer[1, layer, :rows]))

    # --- prefill side --------------------------------------------------------------------------

    def write(self, peer: PoolLayout, src: np.ndarray, notif: bytes) -> tuple[Any, int]:
        """Start writing pool slots `src` of every layer into rows 0.. of the peer's staging
        buffer; the peer gets `notif` once the data is there. Returns (a handle for `state`,
        or None when there was nothing to write; bytes written)."""
        self.agent.add_remote_agent(peer.metadata)  # this room's buffer (cheap once connected)
        if len(src) == 0:
            self.agent.send_notif(peer.agent, notif)
            return None, 0
        s, d, n = slot_runs(src.astype(np.int64), np.arange(len(src), dtype=np.int64))
        size = self.slot_bytes
        own = [t.data_ptr() for t in self.pool.k + self.pool.v]
        theirs = peer.k_ptrs + peer.v_ptrs
        local = [(base + int(a) * size, int(c) * size, self.device_id) for base in own for a, c in zip(s, n)]
        remote = [(base + int(b) * size, int(c) * size, peer.device_id) for base in theirs for b, c in zip(d, n)]
        handle = self.agent.initialize_xfer(
            "WRITE",
            self.agent.get_xfer_descs(local, self.mem_type),
            self.agent.get_xfer_descs(remote, peer.mem_type),
            peer.agent,
            notif,
        )
        if self.agent.transfer(handle) == "ERR":
            self.agent.release_xfer_handle(handle)
            raise RuntimeError("NIXL refused to start the transfer")
        return handle, int(n.sum()) * size * len(own)

    def state(self, handle: Any) -> str:
        """ "DONE", "PROC" (in flight) or "ERR"."""
        return self.agent.check_xfer_state(handle)

    def release(self, handle: Any) -> None:
        try:
            self.agent.release_xfer_handle(handle)
        except Exception:  # a handle of a failed or unfinished transfer
            logger.warning("could not release a KV transfer handle", exc_info=True)

    def notifications(self) -> list[tuple[str, bytes]]:
        """(sending agent, message) of each notification received since the last call."""
        return [(agent, m) for agent, msgs in self.agent.get_new_notifs().items() for m in msgs]

    def close(self) -> None:
        if self.registered is not None:
            self.agent.deregister_memory(self.registered)


def _words(t: torch.Tensor) -> torch.Tensor:
    """Token rows of a pool tensor [slots, heads, dim] or of a staging slice [rows, slot bytes], any
    dtype (fp8 included), as [rows, words]: 8-byte words when a row holds whole ones (the copy into
    the pool then runs 3x faster than byte by byte), else bytes."""
    rows = t.view(torch.uint8).view(t.shape[0], -1)
    return rows.view(torch.int64) if rows.shape[1] % 8 == 0 else rows


def make_transfer(backend: str, pool: KVPool, role: str, host: str, device: str | None) -> NixlTransfer:
    """The transfer engine `--disaggregation-transfer-backend` names."""
    if backend == "nixl":
        return NixlTransfer(pool, role, host, device)
    raise RuntimeError(
        f"--disaggregation-transfer-backend {backend} is not implemented by Arbor (mooncake's "
        "transfer engine needs libibverbs and the CUDA runtime, which this build was not tested "
        "with); use nixl"
    )
