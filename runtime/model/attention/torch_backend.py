"""Torch attention backend: gathers each request's K/V from the pool into a padded batch and
runs masked scaled_dot_product_attention: one call for a prefill batch, one per length-sorted
group for a decode batch (no per-request loop)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from runtime.model.attention.base import AttentionBackend
from runtime.model.forward_batch import ForwardBatch, ForwardMode

DECODE_GROUPS = 8  # a decode batch is split into this many length-sorted groups...
DECODE_GROUP_MIN = 16  # ...of at least this many requests, so each pads only to its own longest


@dataclass
class _Group:
    rows: torch.Tensor  # [b] requests of the batch in this group
    slots: torch.Tensor  # [b, max_kv of the group]
    mask: torch.Tensor  # [b, 1, 1, max_kv]


@dataclass
class _Metadata:
    slots: torch.Tensor  # [B, max_kv]: KV slot per position (0 = dummy beyond seq_len)
    mask: torch.Tensor  # [B, 1, max_q, max_kv] bool: True = may attend
    tok_req: torch.Tensor  # [T]: request of each new token
    tok_off: torch.Tensor  # [T]: its offset among the request's new tokens
    max_q: int


class TorchAttnBackend(AttentionBackend):
    """Reference backend for CPU and GPU; exact, vectorised over the batch."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.mode is ForwardMode.DECODE:
            self.groups = self._decode_groups(batch)
            return
        dev = batch.seq_lens.device
        max_kv = int(batch.seq_lens.max())
        slots = self.req_to_token.table[batch.req_pool_indices, :max_kv].to(torch.int64)
        kv_pos = torch.arange(max_kv, device=dev)
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

    def _decode_groups(self, batch: ForwardBatch) -> list[_Group]:
        """Length-sorted groups of a decode batch: gathering K/V padded per group instead of
        to the batch's longest request roughly halves the bytes copied for mixed lengths."""
        lens = batch.seq_lens
        count = max(1, min(DECODE_GROUPS, batch.batch_size // DECODE_GROUP_MIN))
        order = torch.argsort(lens, stable=True)
        groups = []
        for rows in torch.tensor_split(order, count):
            max_kv = int(lens[rows].max())
            slots = self.req_to_token.table[batch.req_pool_indices[rows], :max_kv].to(torch.int64)
            mask = torch.arange(max_kv, device=lens.device)[None, :] < lens[rows, None]
            groups.append(_Group(rows, slots, mask[:, None, None, :]))
        return groups

    def _decode(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        bsz, hq, dim = q.shape
        out = torch.empty_like(q)
        for g in self.groups:
            k = self.kv_pool.k[layer][g.slots].transpose(1, 2)  # [b, Hkv, max_kv, D]
            v = self.kv_pool.v[layer][g.slots].transpose(1, 2)
            o = F.scaled_dot_product_attention(
                q[g.rows][:, :, None, :], k.to(q.dtype), v.to(q.dtype), attn_mask=g.mask, scale=self.scale,
                enable_gqa=True,
            )  # [b, Hq, 1, D]
            out[g.rows] = o[:, :, 0, :]
        return out.reshape(bsz, hq * dim)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.store(layer, batch.out_cache_loc, k, v)
        if batch.mode is ForwardMode.DECODE:
            return self._decode(q, layer)
        m = self.meta
        bsz, (num_tokens, hq, dim) = batch.batch_size, q.shape
        k_all = self.kv_pool.k[layer][m.slots].transpose(1, 2)  # [B, Hkv, max_kv, D]
        v_all = self.kv_pool.v[layer][m.slots].transpose(1, 2)
        q_pad = q.new_zeros(bsz, m.max_q, hq, dim)
        q_pad[m.tok_req, m.tok_off] = q
        out = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2), k_all.to(q.dtype), v_all.to(q.dtype),
            attn_mask=m.mask, scale=self.scale, enable_gqa=True,
        ).transpose(1, 2)  # [B, max_q, Hq, D]
        return out[m.tok_req, m.tok_off].reshape(num_tokens, hq * dim)
