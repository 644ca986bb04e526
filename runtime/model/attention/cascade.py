"""Cascade attention pieces: finding prefixes a batch shares in the KV pool, attention that
returns its log-sum-exp, and merging two partial attentions over disjoint keys."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor.runtime.model.forward_batch import ForwardBatch
from arbor.runtime.model.ragged import ragged_arange

MIN_SHARED = 64  # shorter common prefixes are cheaper to read per request than to merge


@dataclass
class SharedPrefix:
    """`members` (batch rows) all begin with the same `length` cached KV slots, whole pages."""

    members: torch.Tensor  # [m] int64 batch rows
    length: int
    pages: torch.Tensor  # [length // page_size] int64 page indices of the prefix
    tokens: torch.Tensor  # [n] int64 rows of q: every new token of every member
    first_page: int  # pages[0] when the pages are consecutive (K/V then read as a view), else -1


def find_shared_prefixes(batch: ForwardBatch, table: torch.Tensor, page_size: int) -> list[SharedPrefix]:
    """Groups of requests whose cached prefixes start with the same slots, with the length
    (whole pages, at least MIN_SHARED) they all share. The radix tree hands requests with a
    common prefix the same slots, so equal slots mean equal keys and values."""
    cached = batch.prefix_lens
    eligible = torch.nonzero(cached >= MIN_SHARED).flatten()
    if eligible.numel() < 2:
        return []
    rows = table[batch.req_pool_indices[eligible]]
    first = rows[:, 0]
    order = torch.argsort(first, stable=True)
    _, counts = torch.unique_consecutive(first[order], return_counts=True)
    found = []
    for idx in torch.split(order, counts.tolist()):
        if idx.numel() < 2:
            continue
        limit = int(cached[eligible[idx]].min())
        same = (rows[idx, :limit] == rows[idx[0], :limit]).all(0)
        length = int(same.numel() if bool(same.all()) else int(torch.argmin(same.to(torch.int8))))
        length -= length % page_size
        if length < MIN_SHARED:
            continue
        members = eligible[idx]
        pages = _pages(rows[idx[0], :length], page_size)
        consecutive = pages.numel() == 1 or bool((pages[1:] - pages[:-1] == 1).all())
        tokens = ragged_arange(batch.qo_indptr[members], batch.extend_lens[members])
        found.append(SharedPrefix(members, length, pages, tokens, int(pages[0]) if consecutive else -1))
    return found


def _pages(slots: torch.Tensor, page_size: int) -> torch.Tensor:
    return torch.div(slots[::page_size], page_size, rounding_mode="floor").to(torch.int64)


def attend_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [b, M, Hq, D] against k/v [b, L, Hkv, D] (any strides with unit last dim) with an
    additive float `bias` broadcastable to [b, M, 1, L]. Returns the output [b, M, Hq, D] and
    its log-sum-exp [b, M, Hq], both float32. One pair of matmuls per KV head, the group's
    query heads stacked as rows, so K/V are neither expanded nor copied."""
    b, m, hq, d = q.shape
    hkv, length = k.shape[2], k.shape[1]
    g = hq // hkv
    q = q.to(k.dtype)
    out = torch.empty(b, m, hq, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(b, m, hq, dtype=torch.float32, device=q.device)
    for h in range(hkv):
        heads = slice(h * g, (h + 1) * g)
        qh = q[:, :, heads].reshape(b, m * g, d)
        s = torch.bmm(qh, k[:, :, h].transpose(1, 2)).float().mul_(scale).view(b, m, g, length).add_(bias)
        top = s.amax(-1, keepdim=True)
        p = s.sub_(top).exp_()
        total = p.sum(-1, keepdim=True)
        o = torch.bmm(p.view(b, m * g, length).to(v.dtype), v[:, :, h]).float().view(b, m, g, d)
        out[:, :, heads] = o.div_(total)
        lse[:, :, heads] = (top + total.log()).squeeze(-1)
    return out, lse


def attend_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Every query q [n, Hq, D] against all of one prefix's k/v [P, Hkv, D] (no mask): output
    [n, Hq, D] and log-sum-exp [n, Hq], float32. On CPUs this is torch's flash-attention
    kernel, which returns the log-sum-exp; elsewhere `attend_with_lse`."""
    if q.device.type != "cpu":
        no_bias = torch.zeros(1, 1, 1, 1, dtype=torch.float32, device=q.device)
        o, lse = attend_with_lse(q[None], k[None], v[None], no_bias, scale)
        return o[0], lse[0]
    n, hq, d = q.shape
    hkv = k.shape[1]
    # No mask, so a KV head's query heads can be folded into the query length: [1, Hkv, n*G, D]
    # against that head's keys, with no copy of K/V per query head.
    qf = q.view(n, hkv, hq // hkv, d).transpose(0, 1).reshape(1, hkv, -1, d)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qf, k.to(q.dtype).transpose(0, 1)[None], v.to(q.dtype).transpose(0, 1)[None], scale=scale
    )
    o = o[0].view(hkv, n, hq // hkv, d).transpose(0, 1).reshape(n, hq, d)
    return o.float(), lse[0].view(hkv, n, hq // hkv).transpose(0, 1).reshape(n, hq)


def merge_lse(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over two disjoint key sets: outputs [..., D] and their lse [...]."""
    top = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - top), torch.exp(lse2 - top)
    total = w1 + w2
    out = (o1 * w1[..., None] + o2 * w2[..., None]) / total[..., None]
    return out, top + total.log()
