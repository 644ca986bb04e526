"""Torch attention backend: gathers each request's K/V from the pool into a padded batch and
runs one masked scaled_dot_product_attention for the whole batch (no per-request loop)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.model.attention.base import AttentionBackend
from runtime.model.forward_batch import ForwardBatch, ForwardMode


@dataclass
class _Metadata:
    slots: torch.Tensor  # [B, max_kv]: KV slot per position (0 = dummy beyond seq_len)
    mask: torch.Tensor  # [B, 1, max_q, max_kv] bool: True = may attend
    tok_req: torch.Tensor | None  # [T]: request of each new token (None: one token each)
    tok_off: torch.Tensor | None  # [T]: its offset among the request's new tokens
    max_q: int


class TorchAttnBackend(AttentionBackend):
    """Reference backend for CPU and GPU; exact, vectorised over the batch."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        dev = batch.seq_lens.device
        max_kv = int(batch.seq_lens.max())
        slots = self.req_to_token.table[batch.req_pool_indices, :max_kv].to(torch.int64)
        kv_pos = torch.arange(max_kv, device=dev)
        if batch.mode is ForwardMode.DECODE:
            mask = kv_pos[None, None, :] < batch.seq_lens[:, None, None]
            self.meta = _Metadata(slots, mask[:, None], None, None, 1)
            return
        max_q = int(batch.extend_lens.max())
        q_pos = batch.prefix_lens[:, None] + torch.arange(max_q, device=dev)[None, :]
        mask = kv_pos[None, None, :] <= q_pos[:, :, None]
        mask &= kv_pos[None, None, :] < batch.seq_lens[:, None, None]
        # Padding query rows see position 0 (always valid) instead of nothing, so softmax has
        # no all-masked row (NaN); their outputs are dropped.
        mask[:, :, 0] = True
        tok_req = torch.repeat_interleave(torch.arange(batch.batch_size, device=dev), batch.extend_lens)
        tok_off = torch.arange(tok_req.numel(), device=dev) - batch.qo_indptr[tok_req].to(torch.int64)
        self.meta = _Metadata(slots, mask[:, None], tok_req, tok_off, max_q)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.store(layer, batch.out_cache_loc, k, v)
        m = self.meta
        bsz, (num_tokens, hq, dim) = batch.batch_size, q.shape
        k_all = self.kv_pool.k[layer][m.slots].transpose(1, 2)  # [B, Hkv, max_kv, D]
        v_all = self.kv_pool.v[layer][m.slots].transpose(1, 2)
        if m.tok_req is None:
            q_pad = q.view(bsz, 1, hq, dim)
        else:
            q_pad = q.new_zeros(bsz, m.max_q, hq, dim)
            q_pad[m.tok_req, m.tok_off] = q
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2), k_all.to(q.dtype), v_all.to(q.dtype),
            attn_mask=m.mask, scale=self.scale, enable_gqa=True,
        ).transpose(1, 2)  # [B, max_q, Hq, D]
        if m.tok_req is not None:
            out = out[m.tok_req, m.tok_off]
        return out.reshape(num_tokens, hq * dim)
