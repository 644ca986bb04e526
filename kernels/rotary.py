"""Rotary position embedding (rotate-half form), applied in place to q and k in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotary_kernel(
    Pos,
    Q,
    K,
    Cos,
    Sin,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_c,
    HQ: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(Pos + t).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < HALF
    c = tl.load(Cos + pos * stride_c + cols, mask=ok, other=0.0)
    s = tl.load(Sin + pos * stride_c + cols, mask=ok, other=0.0)
    if h < HQ:  # noqa: SIM108 (a Triton ternary needs a compile-time condition)
        base = Q + t * stride_qt + h * stride_qh
    else:
        base = K + t * stride_kt + (h - HQ) * stride_kh
    a = tl.load(base + cols, mask=ok, other=0.0)
    b = tl.load(base + HALF + cols, mask=ok, other=0.0)
    af = a.to(tl.float32)
    bf = b.to(tl.float32)
    tl.store(base + cols, (af * c - bf * s).to(a.dtype), mask=ok)
    tl.store(base + HALF + cols, (bf * c + af * s).to(a.dtype), mask=ok)


def rotary_triton(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as rotary_ref; q and k may be strided views (last dim contiguous)."""
    tokens, hq, dim = q.shape
    if tokens:
        _rotary_kernel[(tokens, hq + k.shape[1])](
            positions,
            q,
            k,
            cos,
            sin,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos.stride(0),
            HQ=hq,
            HALF=dim // 2,
            BLOCK=triton.next_power_of_2(dim // 2),
        )
    return q, k
