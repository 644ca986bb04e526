"""Triton attention backend: the GPU path. KV store, extend and split-K decode attention are
the kernels in kernels/; the metadata is the CSR of KV slots each request reads.

On a CPU it runs only under Triton's interpreter (TRITON_INTERPRET=1), which the tests use to
prove it equal to the torch backend."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from arbor.kernels.decode_attention import choose_splits, decode_attention_triton
from arbor.kernels.extend_attention import extend_attention_triton
from arbor.kernels.kv_store import store_kv_triton
from arbor.runtime.kv.pool import KVPool, ReqToTokenPool, as_stored, to_kv_dtype
from arbor.runtime.model.attention.base import AttentionBackend
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.ragged import gather_rows, indptr


@dataclass
class _Metadata:
    decode: bool
    kv_indptr: torch.Tensor  # [B + 1] int32: CSR offsets (whole sequence for decode, prefix for extend)
    kv_indices: torch.Tensor  # slots, request by request
    splits: int = 1
    max_extend: int = 1


class TritonAttnBackend(AttentionBackend):
    """Paged attention with Triton kernels (CUDA; CPU only in the interpreter)."""

    def __init__(self, kv_pool: KVPool, req_to_token: ReqToTokenPool, scale: float) -> None:
        device = kv_pool.k[0].device
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                "the triton attention backend needs a CUDA GPU (on a CPU it runs only under "
                "TRITON_INTERPRET=1, slowly); use --attention-backend torch"
            )
        super().__init__(kv_pool, req_to_token, scale)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode is ForwardMode.DECODE:
            hkv = self.kv_pool.k[0].shape[1]
            splits = choose_splits(batch.batch_size, hkv, int(batch.seq_lens.max()), batch.seq_lens.device)
            self.meta = _Metadata(True, batch.kv_indptr, batch.kv_indices, splits=splits)
            return
        prefix = batch.prefix_lens
        indices = gather_rows(self.req_to_token.table, batch.req_pool_indices, prefix)
        self.meta = _Metadata(False, indptr(prefix), indices, max_extend=int(batch.extend_lens.max()))

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        pool_k, pool_v = self.kv_pool.k[layer], self.kv_pool.v[layer]
        k, v = as_stored(k, v, pool_k.dtype)  # rounded in torch, so both backends store the same bits
        store_kv_triton(pool_k, pool_v, batch.out_cache_loc, to_kv_dtype(k, pool_k.dtype), to_kv_dtype(v, pool_v.dtype))
        m = self.meta
        if m.decode:
            out = decode_attention_triton(q, pool_k, pool_v, m.kv_indptr, m.kv_indices, self.scale, m.splits)
        else:
            out = extend_attention_triton(
                q, k, v, pool_k, pool_v, batch.qo_indptr, m.kv_indptr, m.kv_indices, self.scale, m.max_extend
            )
        return out.reshape(q.shape[0], -1)
