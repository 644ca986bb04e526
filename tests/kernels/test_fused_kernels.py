"""Fused elementwise kernels against their torch references (Triton's interpreter on a CPU).
Error bounds: fp32 rtol 1e-4 / atol 1e-5, fp16 rtol 1e-2 / atol 2e-3; the bitmask and the KV
store are exact."""

from __future__ import annotations

import pytest
import torch

from arbor.kernels.activation import silu_and_mul_triton
from arbor.kernels.bitmask import apply_token_bitmask_triton
from arbor.kernels.kv_store import store_kv_triton
from arbor.kernels.norm import rmsnorm_triton
from arbor.kernels.reference import (
    apply_token_bitmask_ref,
    rmsnorm_ref,
    rotary_ref,
    silu_and_mul_ref,
    store_kv_ref,
)
from arbor.kernels.rotary import rotary_triton
from arbor.runtime.model.layers import rope_inv_freq
from tests.kernels.conftest import DEVICE, assert_close, paged_slots

DTYPES = [torch.float32, torch.float16]


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 200])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm(dtype, hidden, with_residual) -> None:
    x = _randn(7, hidden, dtype=dtype, seed=1)
    w = _randn(hidden, dtype=dtype, seed=2)
    r = _randn(7, hidden, dtype=dtype, seed=3) if with_residual else None
    ref = rmsnorm_ref(x, w, 1e-6, r)
    ours = rmsnorm_triton(x, w, 1e-6, r)
    if with_residual:
        assert_close(ours[0], ref[0], dtype)
        assert_close(ours[1], ref[1], dtype)
    else:
        assert_close(ours, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [96, 1500])
def test_silu_and_mul(dtype, inter) -> None:
    x = _randn(5, 2 * inter, dtype=dtype, seed=4)
    assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("hq", "hkv", "dim"), [(4, 4, 64), (8, 1, 128), (8, 2, 64)])
def test_rotary_in_place_on_strided_views(dtype, hq, hkv, dim) -> None:
    tokens = 9
    pos = torch.tensor([0, 1, 5, 6, 7, 100, 101, 2047, 3], device=DEVICE)
    freqs = torch.outer(torch.arange(2048).float(), rope_inv_freq(dim, 10000.0, None))
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos().to(DEVICE), emb.sin().to(DEVICE)

    def qk():  # q and k as views into one fused qkv output, like the model's
        qkv = _randn(tokens, (hq + 2 * hkv) * dim, dtype=dtype, seed=5)
        q, k, _ = qkv.split([hq * dim, hkv * dim, hkv * dim], -1)
        return q.view(tokens, hq, dim), k.view(tokens, hkv, dim)

    q_ref, k_ref = rotary_ref(pos, *qk(), cos, sin)
    q, k = qk()
    out = rotary_triton(pos, q, k, cos, sin)
    assert out[0] is q and out[1] is k
    assert_close(q, q_ref, dtype)
    assert_close(k, k_ref, dtype)


@pytest.mark.parametrize("vocab", [100, 1000, 50257])
def test_token_bitmask_is_exact(vocab) -> None:
    words = -(-vocab // 32)
    gen = torch.Generator().manual_seed(vocab)
    mask = torch.randint(-(2**31), 2**31 - 1, (3, words), generator=gen, dtype=torch.int64).to(torch.int32)
    mask[1] = 0  # nothing allowed
    mask[2, : words // 2] = -1  # a dense run, with bit 31 set (negative words)
    logits = torch.randn(3, vocab, generator=gen).to(DEVICE)
    ref, ours = logits.clone(), logits.clone()
    apply_token_bitmask_ref(ref, mask.to(DEVICE))
    apply_token_bitmask_triton(ours, mask.to(DEVICE))
    assert torch.equal(ours, ref)
    narrow = mask[:, : words // 2].contiguous().to(DEVICE)  # tokens past the mask are forbidden
    ref, ours = logits.clone(), logits.clone()
    apply_token_bitmask_ref(ref, narrow)
    apply_token_bitmask_triton(ours, narrow)
    assert torch.equal(ours, ref) and torch.isinf(ours[:, words // 2 * 32 :]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_kv_store_is_exact(dtype, page_size) -> None:
    slots, size = paged_slots([5, 20], page_size, seed=7)
    where = torch.cat(slots).to(DEVICE)
    k, v = _randn(25, 2, 64, dtype=dtype, seed=8), _randn(25, 2, 64, dtype=dtype, seed=9)
    pools = [torch.zeros(size, 2, 64, dtype=dtype, device=DEVICE) for _ in range(4)]
    store_kv_ref(pools[0], pools[1], where, k, v)
    store_kv_triton(pools[2], pools[3], where, k, v)
    assert torch.equal(pools[0], pools[2]) and torch.equal(pools[1], pools[3])
    assert torch.equal(pools[2][where], k)
