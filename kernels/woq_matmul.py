"""Weight-only quantized GEMM for GPUs (W8A16, W4A16, FP8 weights): y = x @ dequant(codes).T.

Codes are a `QuantWeight`'s (runtime/model/quant/linear.py): uint8 int8 codes, int4 codes two
to a byte in blocks of 32 (byte j of a block holds code j low and code j + 16 high), or
float8_e4m3 bits, with a float32 scale and zero point per row and group of columns. Each
program computes a BLOCK_M x BLOCK_N tile of y, dequantizing a BLOCK_N x BLOCK_K tile of
weights per step in registers, so the weight is read at 1 or 0.5 bytes a value. Reference:
`F.linear(x, QuantWeight.dequantize())`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INT8, INT4, FP8 = 0, 1, 2


@triton.jit
def _woq_kernel(
    X,
    Codes,
    Scale,
    Zero,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_cn,
    stride_sn,
    stride_ym,
    GROUP: tl.constexpr,
    KIND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(
            X + rm[:, None].to(tl.int64) * stride_xm + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0
        ).to(tl.float32)
        w_ok = n_ok[:, None] & k_ok[None, :]
        row = Codes + rn[:, None].to(tl.int64) * stride_cn
        if KIND == 1:  # int4: nibble (k % 32) // 16 of byte (k // 32) * 16 + k % 16
            byte = tl.load(row + ((rk // 32) * 16 + rk % 16)[None, :], mask=w_ok, other=0).to(tl.int32)
            code = ((byte >> (((rk % 32) // 16) * 4)[None, :]) & 15).to(tl.float32)
        elif KIND == 0:
            code = tl.load(row + rk[None, :], mask=w_ok, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        else:  # float8 e4m3 bits -> float16 fields, the value times 2^-8
            bits = tl.load(row + rk[None, :], mask=w_ok, other=0).to(tl.int16)
            half = ((bits & 0x80) << 8) | ((bits & 0x7F) << 7)
            code = half.to(tl.float16, bitcast=True).to(tl.float32) * 256.0
        g = (rk // GROUP)[None, :]
        scale = tl.load(Scale + rn[:, None] * stride_sn + g, mask=w_ok, other=0.0)
        zero = tl.load(Zero + rn[:, None] * stride_sn + g, mask=w_ok, other=0.0)
        w = (code - zero) * scale  # [BLOCK_N, BLOCK_K]
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    tl.store(
        Y + rm[:, None].to(tl.int64) * stride_ym + rn[None, :],
        acc.to(Y.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )


def woq_matmul_triton(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int, kind: int
) -> torch.Tensor:
    """x [M, K] (last dim contiguous) times the dequantized weight [N, K], transposed: [M, N]
    in x's dtype, accumulated in float32."""
    m, k = x.shape
    n = codes.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 64
    block_k = 32 if group % 64 else 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, 64))
    _woq_kernel[grid](
        x,
        codes,
        scale,
        zero,
        y,
        m,
        n,
        k,
        x.stride(0),
        codes.stride(0),
        scale.stride(0),
        y.stride(0),
        GROUP=group,
        KIND=kind,
        BLOCK_M=block_m,
        BLOCK_N=64,
        BLOCK_K=block_k,
    )
    return y
