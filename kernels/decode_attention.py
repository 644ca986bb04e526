"""Paged decode attention (one new token per request) in two stages.

Stage 1 splits each request's KV range into `num_splits` pieces; one program per (request,
KV head, split) reads its K/V once for every query head of the GQA group and writes a
partial output with its log-sum-exp. Stage 2 merges the pieces per (request, query head).
Splitting keeps the GPU busy at small batches with long contexts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from arbor.kernels.online_softmax import attend_block

MAX_SPLITS = 16
MIN_SPLIT_TOKENS = 256  # a split shorter than this costs more to merge than it saves


def choose_splits(batch: int, kv_heads: int, max_len: int, device: torch.device) -> int:
    """Enough programs to fill the GPU about twice, each split at least MIN_SPLIT_TOKENS long."""
    units = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    want = -(-2 * units // max(1, batch * kv_heads))
    return max(1, min(MAX_SPLITS, want, -(-max_len // MIN_SPLIT_TOKENS)))


@triton.jit
def _split_kernel(
    Q,
    K,
    V,
    kv_indptr,
    kv_indices,
    Part,
    Lse,
    scale,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    hs = tl.arange(0, BLOCK_H)
    h_ok = hs < GROUP
    heads = kvh * GROUP + hs
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    start = tl.load(kv_indptr + b)
    length = tl.load(kv_indptr + b + 1) - start
    per = tl.cdiv(length, SPLITS)
    lo = split * per
    hi = tl.minimum(lo + per, length)
    q = tl.load(
        Q + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=h_ok[:, None] & d_ok[None, :], other=0.0
    )
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        slot = tl.load(kv_indices + start + n, mask=n_ok, other=0).to(tl.int64)
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(K + slot[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(V + slot[:, None] * stride_vs + kvh * stride_vh + d[None, :], mask=kv_ok, other=0.0)
        m, denom, acc = attend_block(q, k, v, n_ok[None, :], m, denom, acc, scale, PRECISION)
    filled = denom > 0
    out = tl.where(filled[:, None], acc / tl.where(filled, denom, 1.0)[:, None], 0.0)
    lse = tl.where(filled, m + tl.log(tl.where(filled, denom, 1.0)), float("-inf"))
    tl.store(
        Part + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps + d[None, :],
        out,
        mask=h_ok[:, None] & d_ok[None, :],
    )
    tl.store(Lse + b * stride_lb + heads * stride_lh + split, lse, mask=h_ok)


@triton.jit
def _merge_kernel(
    Part,
    Lse,
    Out,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    m = float("-inf")
    total = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s in tl.static_range(SPLITS):
        lse = tl.load(Lse + b * stride_lb + h * stride_lh + s)
        part = tl.load(Part + b * stride_pb + h * stride_ph + s * stride_ps + d, mask=d_ok, other=0.0)
        m_new = tl.maximum(m, lse)
        live = m_new > float("-inf")
        old = tl.where(live, tl.exp(m - m_new), 0.0)
        new = tl.where(live, tl.exp(lse - m_new), 0.0)
        acc = acc * old + part * new
        total = total * old + new
        m = m_new
    tl.store(Out + b * stride_ob + h * stride_oh + d, (acc / total).to(Out.dtype.element_ty), mask=d_ok)


def decode_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Same contract as decode_attention_ref; `num_splits` None = choose_splits."""
    batch, hq, dim = q.shape
    hkv = k_pool.shape[1]
    group = hq // hkv
    if num_splits is None:
        lens = kv_indptr[1:] - kv_indptr[:-1]
        num_splits = choose_splits(batch, hkv, int(lens.max()) if batch else 1, q.device)
    part = torch.empty(batch, hq, num_splits, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(batch, hq, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    if batch == 0:
        return out
    block_d = max(16, triton.next_power_of_2(dim))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _split_kernel[(batch, hkv, num_splits)](
        q,
        k_pool,
        v_pool,
        kv_indptr,
        kv_indices,
        part,
        lse,
        scale,
        q.stride(0),
        q.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        GROUP=group,
        HEAD_DIM=dim,
        SPLITS=num_splits,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=64,
        BLOCK_D=block_d,
        PRECISION=precision,
    )
    _merge_kernel[(batch, hq)](
        part,
        lse,
        out,
        part.stride(0),
        part.stride(1),
        part.stride(2),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        out.stride(1),
        HEAD_DIM=dim,
        SPLITS=num_splits,
        BLOCK_D=block_d,
    )
    return out
