"""The attention backend contract shared by the torch and (later) Triton implementations."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from arbor.runtime.kv.pool import KVPool, ReqToTokenPool
from arbor.runtime.model.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """Paged attention over a KVPool.

    `init_forward_metadata` runs once per step, before any layer; `forward` runs per layer,
    first storing the new tokens' k/v at `batch.out_cache_loc`, then attending: each new
    token sees its request's cached prefix and the new tokens up to itself (causal).

    A backend with `supports_capture` can also run decode steps recorded once per batch size
    and replayed (CUDA graphs): `init_capture`, then `prepare_for_capture` per captured size,
    then `prepare_for_replay` before each replay. A recorded step replays the same kernels on
    the same memory, so while capturing, `forward` reads the step's metadata only from the
    static buffers `init_capture` made, never from tensors built for one batch.
    """

    supports_capture: ClassVar[bool] = False

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

    def init_capture(self, max_batch_size: int) -> None:
        """Allocate the static metadata buffers of captured decode steps, room for
        `max_batch_size` requests of up to `req_to_token.max_context_len` tokens each. Called
        once, before any capture; the buffers never move or grow afterwards."""
        raise NotImplementedError(f"{type(self).__name__} does not capture decode steps")

    def prepare_for_capture(self, batch: ForwardBatch) -> None:
        """`init_forward_metadata` for the DECODE batch about to be recorded (one of the
        captured sizes, at most `max_batch_size` rows), written into views of the static
        buffers, so every replay of the recording reads what `prepare_for_replay` put there.
        The batch's token-major tensors (`out_cache_loc`, `input_ids`, `positions`) are the
        caller's own static inputs, which it refills before each replay."""
        raise NotImplementedError(f"{type(self).__name__} does not capture decode steps")

    def prepare_for_replay(self, batch: ForwardBatch, padded_size: int) -> None:
        """Write the metadata of a real DECODE batch of `batch.batch_size <= padded_size` rows
        into the static buffers captured for `padded_size`, in place (no allocation).

        Rows `batch.batch_size` to `padded_size` are padding: length 1, reading only the
        reserved dummy slot 0 (the caller pads `out_cache_loc` with 0, so they write there
        too); their outputs are discarded.
        """
        raise NotImplementedError(f"{type(self).__name__} does not capture decode steps")
