"""ForwardBatch: everything one model step needs, as flat tensors on the model's device."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from arbor.runtime.model.ragged import gather_rows, indptr

if TYPE_CHECKING:
    from arbor.runtime.model.attention.base import AttentionBackend


class ForwardMode(Enum):
    """EXTEND: new tokens after a (maybe empty) cached prefix. DECODE: one token per request.
    MIXED: both kinds in one batch (decode requests are extends of length 1)."""

    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"


@dataclass
class ForwardBatch:
    """One step's batch. Token-major tensors have one row per new token, in request order."""

    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64: KV slot each new token writes
    req_pool_indices: torch.Tensor  # [B] int64: row in ReqToTokenPool
    seq_lens: torch.Tensor  # [B] int64: prefix + new tokens
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64
    qo_indptr: torch.Tensor  # [B + 1] int32: CSR offsets of each request's new tokens
    kv_indptr: torch.Tensor  # [B + 1] int32: CSR offsets into kv_indices
    req_to_token: torch.Tensor  # the ReqToTokenPool table kv_indices is read from
    return_all_logits: bool = False
    attn_backend: AttentionBackend | None = None

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.numel())

    @cached_property
    def kv_indices(self) -> torch.Tensor:
        """[sum(seq_lens)] int64: KV slot of every position, request by request (CSR with
        kv_indptr). Built on first use: only kernels that walk CSR need it."""
        return gather_rows(self.req_to_token, self.req_pool_indices, self.seq_lens).to(torch.int64)

    @classmethod
    def build(
        cls,
        mode: ForwardMode,
        input_ids: Sequence[Sequence[int]],
        prefix_lens: Sequence[int],
        req_pool_indices: Sequence[int],
        out_cache_loc: torch.Tensor,
        req_to_token: torch.Tensor,
        return_all_logits: bool = False,
    ) -> ForwardBatch:
        """Assemble a batch from per-request new tokens and cached-prefix lengths."""
        device = req_to_token.device
        extend = [len(ids) for ids in input_ids]
        seq = [p + e for p, e in zip(prefix_lens, extend)]
        if mode is ForwardMode.DECODE and any(e != 1 for e in extend):
            raise ValueError("a DECODE batch has exactly one new token per request")

        def t(x: Sequence[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.tensor(x, dtype=dtype, device=device)

        flat_ids = [tok for ids in input_ids for tok in ids]
        positions = [p + i for p, e in zip(prefix_lens, extend) for i in range(e)]
        rows = t(req_pool_indices)
        seq_t = t(seq)
        extend_t = t(extend)
        return cls(
            mode=mode,
            input_ids=t(flat_ids),
            positions=t(positions),
            out_cache_loc=out_cache_loc.to(device=device, dtype=torch.int64),
            req_pool_indices=rows,
            seq_lens=seq_t,
            prefix_lens=t(prefix_lens),
            extend_lens=extend_t,
            qo_indptr=indptr(extend_t),
            kv_indptr=indptr(seq_t),
            req_to_token=req_to_token,
            return_all_logits=return_all_logits,
        )
