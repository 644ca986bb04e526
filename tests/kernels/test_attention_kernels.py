"""Extend and decode attention kernels against their torch references (Triton's interpreter
on a CPU). Error bounds: fp32 rtol 1e-4 / atol 1e-5, fp16 rtol 1e-2 / atol 2e-3."""

from __future__ import annotations

import pytest
import torch

from arbor.kernels.decode_attention import decode_attention_triton
from arbor.kernels.extend_attention import extend_attention_triton
from arbor.kernels.reference import decode_attention_ref, extend_attention_ref
from tests.kernels.conftest import DEVICE, assert_close, csr, paged_slots

SHAPES = [  # (q heads, kv heads, head_dim): GQA ratios 1, 4, 8; head_dim 64 and 128
    (2, 2, 64),
    (4, 1, 128),
    (8, 2, 64),
    (8, 1, 128),
]
DTYPES = [torch.float32, torch.float16]


def _pools(slots: int, hkv: int, dim: int, dtype: torch.dtype, gen: torch.Generator):
    k = torch.randn(slots, hkv, dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(slots, hkv, dim, generator=gen).to(DEVICE, dtype)
    return k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "dim"), SHAPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_decode_attention(dtype, hq, hkv, dim, page_size, splits) -> None:
    gen = torch.Generator().manual_seed(hq * 100 + dim + page_size)
    lengths = [1, 19, 70, 131]  # one token, and lengths off the 64-token block
    slots, size = paged_slots(lengths, page_size, seed=page_size)
    k_pool, v_pool = _pools(size, hkv, dim, dtype, gen)
    q = torch.randn(len(lengths), hq, dim, generator=gen).to(DEVICE, dtype)
    indptr, indices = csr(slots)
    scale = dim**-0.5
    ref = decode_attention_ref(q, k_pool, v_pool, indptr, indices, scale)
    ours = decode_attention_triton(q, k_pool, v_pool, indptr, indices, scale, num_splits=splits)
    assert_close(ours, ref, dtype)


BATCHES = {  # (prefix, extend) per request
    "mixed": [(0, 5), (17, 1), (33, 40), (64, 16)],
    "prefill": [(0, 70)],
    "cached": [(100, 3), (1, 1)],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "dim"), SHAPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_extend_attention(dtype, hq, hkv, dim, page_size, batch) -> None:
    gen = torch.Generator().manual_seed(hq * 10 + dim + page_size)
    reqs = BATCHES[batch]
    slots, size = paged_slots([p for p, _ in reqs], page_size, seed=page_size)
    k_pool, v_pool = _pools(max(size, page_size), hkv, dim, dtype, gen)
    tokens = sum(e for _, e in reqs)
    q = torch.randn(tokens, hq, dim, generator=gen).to(DEVICE, dtype)
    k = torch.randn(tokens, hkv, dim, generator=gen).to(DEVICE, dtype)
    v = torch.randn(tokens, hkv, dim, generator=gen).to(DEVICE, dtype)
    qo = torch.zeros(len(reqs) + 1, dtype=torch.int32)
    qo[1:] = torch.cumsum(torch.tensor([e for _, e in reqs]), 0)
    qo = qo.to(DEVICE)
    indptr, indices = csr(slots)
    max_extend = max(e for _, e in reqs)
    args = (q, k, v, k_pool, v_pool, qo, indptr, indices, dim**-0.5, max_extend)
    assert_close(extend_attention_triton(*args), extend_attention_ref(*args), dtype)
