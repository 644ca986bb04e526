"""KV transfer engines: a worker's KV pool registered for one-sided writes into a peer's pool."""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import numpy as np

from arbor.runtime.disaggregation.protocol import PoolLayout
from arbor.runtime.memory import KVPool

logger = logging.getLogger(__name__)


def slot_runs(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split a slot-to-slot copy into runs consecutive on both sides: (src starts, dst starts, lengths)."""
    if len(src) == 0:
        return src, dst, src
    cut = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate(([0], cut))
    lengths = np.diff(np.concatenate((starts, [len(src)])))
    return src[starts], dst[starts], lengths


class NixlTransfer:
    """The pool's K and V tensors registered with a NIXL agent (UCX backend: host memory over
    TCP or shared memory here, RDMA where the machine has it)."""

    def __init__(self, pool: KVPool, role: str) -> None:
        try:
            from nixl._api import nixl_agent, nixl_agent_config
        except ImportError as exc:
            raise RuntimeError("--disaggregation-transfer-backend nixl needs the nixl package: "
                               "pip install 'arbor[pd]' (nixl 1.5)") from exc
        name = f"arbor-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # No progress thread: NIXL's spins a whole core, half of a one-core worker's forward
        # (bench_pd). Transfers progress when the scheduler polls their state between steps.
        self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        tensors = pool.k + pool.v
        self.registered = self.agent.register_memory(tensors)
        first = tensors[0]
        self.layout = PoolLayout(
            agent=name, metadata=self.agent.get_agent_metadata(), k_ptrs=[t.data_ptr() for t in pool.k],
            v_ptrs=[t.data_ptr() for t in pool.v], slot_bytes=first[0].numel() * first.element_size(),
            mem_type="VRAM" if first.is_cuda else "DRAM", device_id=first.device.index or 0,
        )
        self._peers: set[str] = set()

    def check_peer(self, peer: PoolLayout) -> str | None:
        """Why this pool cannot write into `peer`'s, or None."""
        own = self.layout
        if len(peer.k_ptrs) != len(own.k_ptrs) or peer.slot_bytes != own.slot_bytes:
            return (f"the decode worker's KV pool has {len(peer.k_ptrs)} layers of {peer.slot_bytes} bytes a token, "
                    f"this prefill worker's {len(own.k_ptrs)} of {own.slot_bytes}: serve the same model with "
                    "the same --kv-cache-dtype and --tp-size on both")
        return None

    def write(self, peer: PoolLayout, src: np.ndarray, dst: np.ndarray, notif: bytes) -> tuple[Any, int]:
        """Start writing slots `src` of every layer into the peer's slots `dst`; the peer gets
        `notif` once the data is there. Returns (a handle for `state`, or None when there was
        nothing to write; bytes written)."""
        if peer.agent not in self._peers:
            self.agent.add_remote_agent(peer.metadata)
            self._peers.add(peer.agent)
        if len(src) == 0:
            self.agent.send_notif(peer.agent, notif)
            return None, 0
        s, d, n = slot_runs(src.astype(np.int64), dst.astype(np.int64))
        size = self.layout.slot_bytes
        own = self.layout.k_ptrs + self.layout.v_ptrs
        theirs = peer.k_ptrs + peer.v_ptrs
        local = [(base + int(a) * size, int(c) * size, self.layout.device_id) for base in own for a, c in zip(s, n)]
        remote = [(base + int(b) * size, int(c) * size, peer.device_id) for base in theirs for b, c in zip(d, n)]
        handle = self.agent.initialize_xfer(
            "WRITE", self.agent.get_xfer_descs(local, self.layout.mem_type),
            self.agent.get_xfer_descs(remote, peer.mem_type), peer.agent, notif)
        if self.agent.transfer(handle) == "ERR":
            self.agent.release_xfer_handle(handle)
            raise RuntimeError("NIXL refused to start the transfer")
        return handle, int(n.sum()) * size * len(own)

    def state(self, handle: Any) -> str:
        """"DONE", "PROC" (in flight) or "ERR"."""
        return self.agent.check_xfer_state(handle)

    def release(self, handle: Any) -> None:
        try:
            self.agent.release_xfer_handle(handle)
        except Exception:  # a handle of a failed or unfinished transfer
            logger.warning("could not release a KV transfer handle", exc_info=True)

    def notifications(self) -> list[bytes]:
        """Notifications received from peers since the last call."""
        return [m for msgs in self.agent.get_new_notifs().values() for m in msgs]

    def close(self) -> None:
        self.agent.deregister_memory(self.registered)


def make_transfer(backend: str, pool: KVPool, role: str) -> NixlTransfer:
    """The transfer engine `--disaggregation-transfer-backend` names."""
    if backend == "nixl":
        return NixlTransfer(pool, role)
    raise RuntimeError(f"--disaggregation-transfer-backend {backend} is not implemented by Arbor (mooncake's "
                       "transfer engine needs libibverbs and the CUDA runtime, which this build was not tested "
                       "with); use nixl")
