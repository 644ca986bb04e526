"""Torch attention backend: gathers each request's K/V from the pool into a padded batch and
runs masked scaled_dot_product_attention, one call per length-sorted group of requests (no
per-request loop). The same path serves prefill, decode and short extends (a decode step after
jump-forward), so a few multi-token requests do not make the whole batch pad to a prefill."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from arbor.runtime.model.attention.base import AttentionBackend
from arbor.runtime.model.forward_batch import ForwardBatch

GROUPS = 8  # a batch is split into at most this many length-sorted groups...
GROUP_MIN = 16  # ...of at least this many requests, so each pads only to its own longest


@dataclass
class _Group:
    slots: torch.Tensor  # [b, max_kv]: KV slot per position (0 = dummy beyond seq_len)
    mask: torch.Tensor  # [b, 1, max_q, max_kv] bool: True = may attend
    tokens: torch.Tensor  # [n]: rows of q (new tokens) belonging to this group
    tok_req: torch.Tensor  # [n]: their request within the group
    tok_off: torch.Tensor  # [n]: their offset among that request's new tokens
    max_q: int


class TorchAttnBackend(AttentionBackend):
    """Reference backend for CPU and GPU; exact, vectorised over the batch."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        count = max(1, min(GROUPS, batch.batch_size // GROUP_MIN))
        order = torch.argsort(batch.seq_lens, stable=True)
        self.groups = [self._group(batch, rows) for rows in torch.tensor_split(order, count)]

    def _group(self, batch: ForwardBatch, rows: torch.Tensor) -> _Group:
        """Padding only to the group's longest request roughly halves the K/V bytes gathered
        for mixed lengths."""
        dev = rows.device
        seq, ext = batch.seq_lens[rows], batch.extend_lens[rows]
        max_kv, max_q = int(seq.max()), int(ext.max())
        slots = self.req_to_token.table[batch.req_pool_indices[rows], :max_kv].to(torch.int64)
        kv_pos = torch.arange(max_kv, device=dev)
        q_pos = batch.prefix_lens[rows, None] + torch.arange(max_q, device=dev)[None, :]
        mask = (kv_pos[None, None, :] <= q_pos[:, :, None]) & (kv_pos[None, None, :] < seq[:, None, None])
        # Padding query rows see position 0 (always valid) instead of nothing, so softmax has
        # no all-masked row (NaN); their outputs are dropped.
        mask[:, :, 0] = True
        tok_req = torch.repeat_interleave(torch.arange(rows.numel(), device=dev), ext)
        tok_off = torch.arange(tok_req.numel(), device=dev) - (torch.cumsum(ext, 0) - ext)[tok_req]
        tokens = batch.qo_indptr[rows].to(torch.int64)[tok_req] + tok_off
        return _Group(slots, mask[:, None], tokens, tok_req, tok_off, max_q)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.store(layer, batch.out_cache_loc, k, v)
        num_tokens, hq, dim = q.shape
        out = torch.empty_like(q)
        for g in self.groups:
            k_all = self.kv_pool.k[layer][g.slots].transpose(1, 2)  # [b, Hkv, max_kv, D]
            v_all = self.kv_pool.v[layer][g.slots].transpose(1, 2)
            q_pad = q.new_zeros(g.slots.shape[0], g.max_q, hq, dim)
            q_pad[g.tok_req, g.tok_off] = q[g.tokens]
            o = F.scaled_dot_product_attention(
                q_pad.transpose(1, 2), k_all.to(q.dtype), v_all.to(q.dtype),
                attn_mask=g.mask, scale=self.scale, enable_gqa=True,
            ).transpose(1, 2)  # [b, max_q, Hq, D]
            out[g.tokens] = o[g.tok_req, g.tok_off]
        return out.reshape(num_tokens, hq * dim)
