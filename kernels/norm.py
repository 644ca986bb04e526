"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    X,
    R,
    W,
    Out,
    Sum,
    eps,
    stride_x,
    stride_r,
    stride_o,
    stride_s,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        x = x + tl.load(R + row * stride_r + cols, mask=ok, other=0.0)
        tl.store(Sum + row * stride_s + cols, x, mask=ok)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / N + eps)
    w = tl.load(W + cols, mask=ok, other=0.0)
    tl.store(Out + row * stride_o + cols, (w * h.to(x.dtype)).to(Out.dtype.element_ty), mask=ok)


def rmsnorm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as rmsnorm_ref; one program per row (any leading shape, last dim contiguous)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    out = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    r2 = residual.reshape(-1, shape[-1]) if residual is not None else x2
    total = torch.empty_like(x2) if residual is not None else x2
    if x2.shape[0]:
        _rmsnorm_kernel[(x2.shape[0],)](
            x2,
            r2,
            weight,
            out,
            total,
            eps,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            total.stride(0),
            N=shape[-1],
            BLOCK=triton.next_power_of_2(shape[-1]),
            HAS_RESIDUAL=residual is not None,
        )
    out = out.reshape(shape)
    return out if residual is None else (out, total.reshape(shape))
