"""The attention backend contract shared by the torch and (later) Triton implementations."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from arbor.runtime.kv.pool import KVPool, ReqToTokenPool
from arbor.runtime.model.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """Paged attention over a KVPool.

    `init_forward_metadata` runs once per step, before any layer; `forward` runs per layer,
    first storing the new tokens' k/v at `batch.out_cache_loc`, then attending: each new
    token sees its request's cached prefix and the new tokens up to itself (causal).
    """

    def __init__(self, kv_pool: KVPool, req_to_token: ReqToTokenPool, scale: float) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.scale = scale

    @abstractmethod
    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        """Precompute whatever every layer of this step shares (masks, gather indices)."""

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] for the new tokens -> attention output [T, Hq * D]."""
