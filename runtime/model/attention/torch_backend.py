"""Torch attention backend for CPUs (and a reference on GPUs), planned once per step.

Two ideas keep the cost near what the batch must read:
- Shared prefixes are read once (cascade attention). Requests whose KV rows begin with the
  same cached slots (the radix tree gave them one prefix) attend to that prefix together:
  every new token of the group in one matmul per KV head, with the softmax statistics merged
  into each request's own part by log-sum-exp.
- Each request's own part is gathered by whole pages, padded only to its length-sorted
  group's longest, and read per KV head through strided views (no GQA expansion, no
  transposed copies). Short queries (decode, jump-forward) use explicit matmuls with an fp32
  softmax; long prefills without a shared prefix use scaled_dot_product_attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from arbor.runtime.model.attention.base import AttentionBackend
from arbor.runtime.model.attention.cascade import (
    SharedPrefix,
    attend_with_lse,
    find_shared_prefixes,
    merge_lse,
)
from arbor.runtime.model.forward_batch import ForwardBatch

GROUPS = 8  # a batch is split into at most this many length-sorted groups...
GROUP_MIN = 16  # ...of at least this many requests, so each pads only to its own longest
SDPA_MIN_Q = 16  # groups with longer queries (and no shared prefix) go to the fused SDPA kernel


@dataclass
class _Group:
    """Requests padded together; each one's own KV starts at a page boundary."""

    pages: torch.Tensor  # [b, n_pages] page index per request (0 = dummy page)
    bias: torch.Tensor  # [b, max_q, 1, n_pages * page_size] float: 0 or -inf
    tokens: torch.Tensor  # [n] rows of q (new tokens) in this group
    tok_req: torch.Tensor  # [n] their request within the group
    tok_off: torch.Tensor  # [n] their offset among that request's new tokens
    max_q: int
    use_sdpa: bool


class TorchAttnBackend(AttentionBackend):
    """Exact paged attention in torch ops, vectorised over the batch."""

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.page_size = self.req_to_token.page_size
        self.shared = find_shared_prefixes(batch, self.req_to_token.table, self.page_size)
        start = torch.zeros_like(batch.seq_lens)
        for sp in self.shared:
            start[sp.members] = sp.length
        count = max(1, min(GROUPS, batch.batch_size // GROUP_MIN))
        order = torch.argsort(batch.seq_lens - start, stable=True)
        self.groups = [self._group(batch, rows, start[rows], bool((start[rows] > 0).any()))
                       for rows in torch.tensor_split(order, count)]

    def _group(self, batch: ForwardBatch, rows: torch.Tensor, start: torch.Tensor, shared: bool) -> _Group:
        dev, ps = rows.device, self.page_size
        seq, ext, pre = batch.seq_lens[rows], batch.extend_lens[rows], batch.prefix_lens[rows]
        max_q = int(ext.max())
        n_pages = int(((seq - start + ps - 1) // ps).max())
        page_pos = start[:, None] + torch.arange(n_pages, device=dev)[None, :] * ps
        page_pos = page_pos.clamp_(max=self.req_to_token.max_context_len - 1)
        table = self.req_to_token.table[batch.req_pool_indices[rows, None], page_pos]
        pages = torch.div(table, ps, rounding_mode="floor").to(torch.int64)
        kv_pos = start[:, None, None] + torch.arange(n_pages * ps, device=dev)[None, None, :]
        q_pos = (pre[:, None] + torch.arange(max_q, device=dev)[None, :])[:, :, None]
        allowed = (kv_pos <= q_pos) & (kv_pos < seq[:, None, None])
        # Padding query rows see their first key instead of nothing, so softmax has no
        # all-masked row (NaN); their outputs are dropped.
        allowed[:, :, 0] = True
        bias = torch.zeros(allowed.shape, dtype=torch.float32, device=dev).masked_fill_(~allowed, float("-inf"))
        tok_req = torch.repeat_interleave(torch.arange(rows.numel(), device=dev), ext)
        tok_off = torch.arange(tok_req.numel(), device=dev) - (torch.cumsum(ext, 0) - ext)[tok_req]
        tokens = batch.qo_indptr[rows].to(torch.int64)[tok_req] + tok_off
        use_sdpa = max_q >= SDPA_MIN_Q and not shared
        return _Group(pages, bias[:, :, None], tokens, tok_req, tok_off, max_q, use_sdpa)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        self.kv_pool.store(layer, batch.out_cache_loc, k, v)
        num_tokens, hq, dim = q.shape
        k_pages = self.kv_pool.k[layer].unflatten(0, (-1, self.page_size))  # [pages, ps, Hkv, D]
        v_pages = self.kv_pool.v[layer].unflatten(0, (-1, self.page_size))
        out = torch.empty(num_tokens, hq, dim, dtype=torch.float32, device=q.device)
        lse = torch.empty(num_tokens, hq, dtype=torch.float32, device=q.device)
        for g in self.groups:
            b = g.pages.shape[0]
            k_own = k_pages[g.pages].flatten(1, 2)  # [b, L, Hkv, D]
            v_own = v_pages[g.pages].flatten(1, 2)
            q_pad = q.new_zeros(b, g.max_q, hq, dim)
            q_pad[g.tok_req, g.tok_off] = q[g.tokens]
            if g.use_sdpa:  # no shared prefix to merge with, so no lse needed
                o = F.scaled_dot_product_attention(
                    q_pad.transpose(1, 2), k_own.transpose(1, 2).to(q.dtype), v_own.transpose(1, 2).to(q.dtype),
                    attn_mask=g.bias.squeeze(2)[:, None].to(q.dtype), scale=self.scale, enable_gqa=True,
                ).transpose(1, 2)
                out[g.tokens] = o[g.tok_req, g.tok_off].float()
                continue
            o, s = attend_with_lse(q_pad, k_own, v_own, g.bias, self.scale)
            out[g.tokens] = o[g.tok_req, g.tok_off]
            lse[g.tokens] = s[g.tok_req, g.tok_off]
        for sp in self.shared:
            self._add_shared(sp, q, k_pages, v_pages, out, lse)
        return out.to(q.dtype).reshape(num_tokens, hq * dim)

    def _add_shared(
        self, sp: SharedPrefix, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor,
    ) -> None:
        """Attend every new token of the group to the shared prefix at once, then merge."""
        k_pre = k_pages[sp.pages].flatten(0, 1)[None]  # [1, P, Hkv, D]
        v_pre = v_pages[sp.pages].flatten(0, 1)[None]
        no_bias = torch.zeros(1, 1, 1, 1, dtype=torch.float32, device=q.device)
        o, s = attend_with_lse(q[sp.tokens][None], k_pre, v_pre, no_bias, self.scale)
        out[sp.tokens], lse[sp.tokens] = merge_lse(out[sp.tokens], lse[sp.tokens], o[0], s[0])
