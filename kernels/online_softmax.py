"""The online-softmax step both attention kernels share."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_block(q, k, v, allowed, m, denom, acc, scale, PRECISION: tl.constexpr):
    """Fold one block of keys/values into the running row max `m`, softmax denominator and
    output accumulator (all float32); `allowed` [rows, keys] masks scores to -inf."""
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=PRECISION) * scale
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
    return m_new, denom * alpha + tl.sum(p, 1), acc
