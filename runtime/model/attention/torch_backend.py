"""Torch attention backend for CPUs (and a reference on GPUs), planned once per step.

Three ideas keep the cost near what the batch must read:
- On CPUs, rows with short queries (decode, jump-forward, suffixes after a shared prefix)
  go to Arbor's paged-attention kernel (`kernels/cpu_ops.cpp`), which reads each key row of
  the pool in place, once for all query heads of its KV head. Without a compiler, they take
  the gathered path below.
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

from arbor.kernels import cpu_ops
from arbor.runtime.kv.pool import KVPool, ReqToTokenPool, as_stored
from arbor.runtime.model.attention.base import AttentionBackend
from arbor.runtime.model.attention.cascade import (
    SharedPrefix,
    attend_prefix,
    attend_with_lse,
    find_shared_prefixes,
    merge_lse,
)
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.ragged import indptr, ragged_arange

GROUPS = 8  # a batch is split into at most this many length-sorted groups...
GROUP_MIN = 16  # ...of at least this many requests, so each pads only to its own longest
SDPA_MIN_Q = 16  # groups with longer queries (and no shared prefix) go to the fused SDPA kernel


@dataclass
class _Group:
    """Requests padded together; each one's own KV starts at a page boundary."""

    pages: torch.Tensor  # [b, n_pages] page index per request (0 = dummy page)
    bias: torch.Tensor  # [b, max_q, 1, n_pages * page_size] float: 0 or -inf (empty when fresh)
    tokens: torch.Tensor  # [n] rows of q (new tokens) in this group
    padded: torch.Tensor  # [n] their rows in the flattened padded [b * max_q] layout
    source: torch.Tensor  # [b * max_q] the q row each padded row copies (padding: the last real one)
    max_q: int
    use_sdpa: bool
    fresh: bool  # no request has cached KV: keys are the new tokens' own k/v, no pool read


@dataclass
class _KernelRows:
    """Rows that the CPU kernel attends: their KV starts at `kv_start` (past a shared prefix)."""

    tokens: torch.Tensor  # [n] rows of q
    req_rows: torch.Tensor  # [b] rows of the request-to-token table
    kv_start: torch.Tensor  # [b]
    seq_lens: torch.Tensor  # [b]
    qo_indptr: torch.Tensor  # [b + 1] into `tokens`


class TorchAttnBackend(AttentionBackend):
    """Exact paged attention in torch ops (and the CPU kernel), vectorised over the batch."""

    def __init__(self, kv_pool: KVPool, req_to_token: ReqToTokenPool, scale: float) -> None:
        super().__init__(kv_pool, req_to_token, scale)
        self.ops = cpu_ops.load() if kv_pool.k[0].device.type == "cpu" else None

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.page_size = self.req_to_token.page_size
        self.shared = find_shared_prefixes(batch, self.req_to_token.table, self.page_size)
        if (
            self.ops is not None
            and not self.shared
            and (batch.mode is ForwardMode.DECODE or int(batch.extend_lens.max()) < SDPA_MIN_Q)
        ):
            self._plan_short(batch)
            return
        start = torch.zeros_like(batch.seq_lens)
        for sp in self.shared:
            start[sp.members] = sp.length
        self.kernel = None
        rest = torch.arange(batch.batch_size, device=start.device)
        if self.ops is not None:
            short = (batch.extend_lens < SDPA_MIN_Q) | (start > 0)
            self.kernel = self._kernel_rows(batch, torch.nonzero(short).flatten(), start) if bool(short.any()) else None
            rest = torch.nonzero(~short).flatten()
        count = max(1, min(GROUPS, rest.numel() // GROUP_MIN))
        order = rest[torch.argsort((batch.seq_lens - start)[rest], stable=True)]
        self.groups = [
            self._group(batch, rows, start[rows], bool((start[rows] > 0).any()))
            for rows in torch.tensor_split(order, count)
            if rows.numel()
        ]
        # Tokens attended in float32 (the kernel, the lse path) join SDPA's output at the end.
        exact = [g.tokens for g in self.groups if not g.use_sdpa]
        exact += [self.kernel.tokens] if self.kernel is not None else []
        self.any_sdpa = any(g.use_sdpa for g in self.groups)
        # Every token in order through the kernel (decode, or suffixes after one shared
        # prefix): no copies around it, the prefix's part handed to it as its starting state.
        self.kernel_all = self.kernel is not None and not self.groups
        self.exact_tokens = torch.cat(exact) if exact else None

    def _plan_short(self, batch: ForwardBatch) -> None:
        """Short queries and no shared prefix (decode, a speculative verify step, a draft's
        catch-up): every token to the kernel from position 0, nothing to pad or merge."""
        rows = torch.arange(batch.input_ids.numel(), device=batch.seq_lens.device)
        self.kernel = _KernelRows(
            rows,
            batch.req_pool_indices,
            torch.zeros_like(batch.seq_lens),
            batch.seq_lens,
            batch.qo_indptr.to(torch.int64),
        )
        self.groups, self.any_sdpa, self.kernel_all, self.exact_tokens = [], False, True, rows

    def _kernel_rows(self, batch: ForwardBatch, rows: torch.Tensor, start: torch.Tensor) -> _KernelRows:
        ext = batch.extend_lens[rows]
        tokens = ragged_arange(batch.qo_indptr[rows], ext)
        return _KernelRows(
            tokens,
            batch.req_pool_indices[rows].contiguous(),
            start[rows].contiguous(),
            batch.seq_lens[rows].contiguous(),
            indptr(ext, torch.int64),
        )

    def _group(self, batch: ForwardBatch, rows: torch.Tensor, start: torch.Tensor, shared: bool) -> _Group:
        dev, ps = rows.device, self.page_size
        seq, ext, pre = batch.seq_lens[rows], batch.extend_lens[rows], batch.prefix_lens[rows]
        max_q = int(ext.max())
        n_pages = int(((seq - start + ps - 1) // ps).max())
        page_pos = start[:, None] + torch.arange(n_pages, device=dev)[None, :] * ps
        page_pos = page_pos.clamp_(max=self.req_to_token.max_context_len - 1)
        table = self.req_to_token.table[batch.req_pool_indices[rows, None], page_pos]
        pages = torch.div(table, ps, rounding_mode="floor").to(torch.int64)
        use_sdpa = max_q >= SDPA_MIN_Q and not shared
        fresh = use_sdpa and not bool(pre.any())
        bias = torch.empty(0, device=dev) if fresh else self._bias(start, seq, pre, max_q, n_pages * ps)
        first = batch.qo_indptr[rows].to(torch.int64)
        tokens = ragged_arange(first, ext)
        padded = ragged_arange(torch.arange(rows.numel(), device=dev) * max_q, ext)  # row-major [b, max_q]
        # Padding rows copy a real row: finite values, masked as keys, dropped as queries.
        offs = torch.minimum(torch.arange(max_q, device=dev)[None, :], (ext - 1)[:, None])
        source = (first[:, None] + offs).reshape(-1)
        return _Group(pages, bias, tokens, padded, source, max_q, use_sdpa, fresh)

    @staticmethod
    def _bias(start: torch.Tensor, seq: torch.Tensor, pre: torch.Tensor, max_q: int, width: int) -> torch.Tensor:
        """[b, max_q, 1, width] float mask, 0 or -inf: causal over each request's own keys.
        Fresh groups need none (SDPA's is_causal is exact for them)."""
        dev = start.device
        kv_pos = start[:, None, None] + torch.arange(width, device=dev)[None, None, :]
        q_pos = (pre[:, None] + torch.arange(max_q, device=dev)[None, :])[:, :, None]
        allowed = (kv_pos <= q_pos) & (kv_pos < seq[:, None, None])
        # Padding query rows see their first key instead of nothing, so softmax has no
        # all-masked row (NaN); their outputs are dropped.
        allowed[:, :, 0] = True
        return torch.zeros(allowed.shape, dtype=torch.float32, device=dev).masked_fill_(~allowed, float("-inf"))[
            :, :, None
        ]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        k, v = as_stored(k, v, self.kv_pool.dtype)
        self.kv_pool.store(layer, batch.out_cache_loc, k, v)
        num_tokens, hq, dim = q.shape
        prior = self._shared_part(q, *self._pages(layer)) if self.shared else None
        if self.kernel_all:
            return self._kernel_attend(q, layer, prior)[0].to(q.dtype).reshape(num_tokens, hq * dim)
        k_pages, v_pages = self._pages(layer)
        out = torch.empty(num_tokens, hq, dim, dtype=torch.float32, device=q.device)  # float32 rows
        lse = torch.empty(num_tokens, hq, dtype=torch.float32, device=q.device)
        if self.kernel is not None:
            tokens = self.kernel.tokens
            own_prior = None if prior is None else (prior[0][tokens], prior[1][tokens])
            out[tokens], lse[tokens] = self._kernel_attend(q[tokens], layer, own_prior)
        final = torch.empty(num_tokens, hq, dim, dtype=q.dtype, device=q.device) if self.any_sdpa else None
        for g in self.groups:
            q_pad = self._pad(q, g)
            if g.fresh:
                k_own, v_own = self._pad(k, g), self._pad(v, g)
            else:  # [b, L, Hkv, D], widened from a float8 pool
                k_own = k_pages[g.pages].flatten(1, 2).to(q.dtype)
                v_own = v_pages[g.pages].flatten(1, 2).to(q.dtype)
            if g.use_sdpa:  # no shared prefix to merge with, so no lse needed
                # Fresh prompts are right-padded, so plain causal masking is exact for real rows.
                mask = None if g.fresh else g.bias.squeeze(2)[:, None].to(q.dtype)
                o = F.scaled_dot_product_attention(
                    q_pad.transpose(1, 2),
                    k_own.transpose(1, 2).to(q.dtype),
                    v_own.transpose(1, 2).to(q.dtype),
                    attn_mask=mask,
                    is_causal=g.fresh,
                    scale=self.scale,
                    enable_gqa=True,
                ).transpose(1, 2)
                assert final is not None  # allocated when any group uses SDPA
                final.index_copy_(0, g.tokens, o.flatten(0, 1).index_select(0, g.padded))
                continue
            o, s = attend_with_lse(q_pad, k_own, v_own, g.bias, self.scale)
            o, s = o.flatten(0, 1).index_select(0, g.padded), s.flatten(0, 1).index_select(0, g.padded)
            if prior is not None:
                o, s = merge_lse(o, s, prior[0][g.tokens], prior[1][g.tokens])
            out.index_copy_(0, g.tokens, o)
            lse.index_copy_(0, g.tokens, s)
        if final is None:
            return out.to(q.dtype).reshape(num_tokens, hq * dim)
        if self.exact_tokens is not None:
            final.index_copy_(0, self.exact_tokens, out.index_select(0, self.exact_tokens).to(q.dtype))
        return final.reshape(num_tokens, hq * dim)

    def _pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V pools as pages [pages, page_size, Hkv, D]."""
        return (
            self.kv_pool.k[layer].unflatten(0, (-1, self.page_size)),
            self.kv_pool.v[layer].unflatten(0, (-1, self.page_size)),
        )

    def _kernel_attend(
        self, q: torch.Tensor, layer: int, prior: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel rows' attention (output and lse, float32), starting from `prior` (their
        shared prefix's part) where given; q holds just their tokens."""
        kr = self.kernel
        assert kr is not None and self.ops is not None  # called only when this batch has kernel rows
        po, pl = (None, None) if prior is None else (prior[0].contiguous(), prior[1].contiguous())
        return self.ops.paged_attention(
            q,
            self.kv_pool.k[layer],
            self.kv_pool.v[layer],
            self.req_to_token.table,
            kr.req_rows,
            kr.kv_start,
            kr.seq_lens,
            kr.qo_indptr,
            self.scale,
            po,
            pl,
        )

    def _shared_part(
        self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's attention to its group's shared prefix, all the group's new tokens at
        once: output [T, Hq, D] and lse [T, Hq] (-inf for tokens in no group), float32."""
        if len(self.shared) == 1 and self.shared[0].tokens.numel() == q.shape[0]:  # every token, in order
            return attend_prefix(q, *self._prefix_kv(self.shared[0], k_pages, v_pages, q.dtype), self.scale)
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
        for sp in self.shared:
            out[sp.tokens], lse[sp.tokens] = attend_prefix(
                q[sp.tokens], *self._prefix_kv(sp, k_pages, v_pages, q.dtype), self.scale
            )
        return out, lse

    @staticmethod
    def _prefix_kv(
        sp: SharedPrefix, k_pages: torch.Tensor, v_pages: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's K and V [P, Hkv, D] in `dtype`: a view when its pages are consecutive
        (and the pool holds `dtype`), else gathered."""
        pages = slice(sp.first_page, sp.first_page + sp.pages.numel()) if sp.first_page >= 0 else sp.pages
        return k_pages[pages].flatten(0, 1).to(dtype), v_pages[pages].flatten(0, 1).to(dtype)

    @staticmethod
    def _pad(x: torch.Tensor, g: _Group) -> torch.Tensor:
        """The group's rows of x [T, H, D] as [b, max_q, H, D] (padding repeats a real row)."""
        return x.index_select(0, g.source).view(-1, g.max_q, x.shape[1], x.shape[2])
