"""Extend attention: the new tokens of each request (a prefill, or a prefill after a cached
prefix) attend to the prefix through a CSR of KV slots and causally to each other.

One program per (request, query head, block of new tokens); variable lengths in one launch.
The prefix is read from the paged pool, the new tokens' K/V from the projection outputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from arbor.kernels.online_softmax import attend_block


@triton.jit
def _extend_kernel(
    Q,
    Kn,
    Vn,
    Kp,
    Vp,
    qo_indptr,
    kv_indptr,
    kv_indices,
    Out,
    scale,
    stride_qt,
    stride_qh,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    stride_kps,
    stride_kph,
    stride_vps,
    stride_vph,
    stride_ot,
    stride_oh,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    block = tl.program_id(2)
    kvh = h // GROUP
    q_start = tl.load(qo_indptr + b)
    ext = tl.load(qo_indptr + b + 1) - q_start
    if block * BLOCK_M >= ext:
        return
    p_start = tl.load(kv_indptr + b)
    prefix = tl.load(kv_indptr + b + 1) - p_start
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    r_ok = rows < ext
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(
        Q + (q_start + rows)[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=r_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for n0 in range(0, prefix, BLOCK_N):  # the cached prefix, through the slot CSR
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < prefix
        slot = tl.load(kv_indices + p_start + n, mask=n_ok, other=0).to(tl.int64)
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(Kp + slot[:, None] * stride_kps + kvh * stride_kph + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(Vp + slot[:, None] * stride_vps + kvh * stride_vph + d[None, :], mask=kv_ok, other=0.0)
        m, denom, acc = attend_block(q, k, v, n_ok[None, :], m, denom, acc, scale, PRECISION)
    hi = tl.minimum(ext, (block + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):  # the new tokens, causally
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < ext
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(Kn + (q_start + n)[:, None] * stride_knt + kvh * stride_knh + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(Vn + (q_start + n)[:, None] * stride_vnt + kvh * stride_vnh + d[None, :], mask=kv_ok, other=0.0)
        causal = (n[None, :] <= rows[:, None]) & n_ok[None, :]
        m, denom, acc = attend_block(q, k, v, causal, m, denom, acc, scale, PRECISION)
    out = acc / denom[:, None]
    tl.store(
        Out + (q_start + rows)[:, None] * stride_ot + h * stride_oh + d[None, :],
        out.to(Out.dtype.element_ty),
        mask=r_ok[:, None] & d_ok[None, :],
    )


def extend_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    max_extend: int,
) -> torch.Tensor:
    """Same contract as extend_attention_ref (last dims contiguous)."""
    tokens, hq, dim = q.shape
    out = torch.empty_like(q)
    batch = qo_indptr.numel() - 1
    if tokens == 0:
        return out
    block_m = 64 if max_extend > 32 else 16
    _extend_kernel[(batch, hq, triton.cdiv(max_extend, block_m))](
        q,
        k,
        v,
        k_pool,
        v_pool,
        qo_indptr,
        kv_indptr,
        kv_indices,
        out,
        scale,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_pool.stride(0),
        k_pool.stride(1),
        v_pool.stride(0),
        v_pool.stride(1),
        out.stride(0),
        out.stride(1),
        GROUP=hq // k.shape[1],
        HEAD_DIM=dim,
        BLOCK_M=block_m,
        BLOCK_N=32 if block_m == 16 else 64,
        BLOCK_D=max(16, triton.next_power_of_2(dim)),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
