"""KV store: scatter the new tokens' k/v into their pool slots."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kernel(Slots, K, V, Kp, Vp, stride_kt, stride_vt, stride_ps, ROW: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < ROW
    slot = tl.load(Slots + t).to(tl.int64)
    k = tl.load(K + t * stride_kt + cols, mask=ok)
    v = tl.load(V + t * stride_vt + cols, mask=ok)
    tl.store(Kp + slot * stride_ps + cols, k.to(Kp.dtype.element_ty), mask=ok)
    tl.store(Vp + slot * stride_ps + cols, v.to(Vp.dtype.element_ty), mask=ok)


def store_kv_triton(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Same contract as store_kv_ref; each token's [Hkv, D] row is contiguous in k, v and pools."""
    tokens = slots.numel()
    if not tokens:
        return
    row = k.shape[1] * k.shape[2]
    k2, v2 = k.reshape(tokens, row), v.reshape(tokens, row)
    block = min(1024, triton.next_power_of_2(row))
    _store_kernel[(tokens, triton.cdiv(row, block))](
        slots,
        k2,
        v2,
        k_pool,
        v_pool,
        k2.stride(0),
        v2.stride(0),
        k_pool.stride(0),
        ROW=row,
        BLOCK=block,
    )
