"""Arbor's C++ CPU kernels equal their torch references: fp32 within float rounding, bf16 bit
for bit (they round where the references' torch ops round). Attention is covered through the
backend in tests/runtime/test_torch_attention.py."""

from __future__ import annotations

import pytest
import torch

from arbor.kernels import cpu_ops
from arbor.kernels.reference import rmsnorm_ref, rotary_ref, silu_and_mul_ref, store_kv_ref

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    assert cpu_ops.load() is not None, "the CPU kernels build on this machine (a compiler is present)"


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:  # at most one bf16 rounding step apart where float sums differ in order
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=1e-5)
        assert (got == want).float().mean() > 0.99


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm(dtype: torch.dtype, residual: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 96, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(96, generator=gen)).to(dtype)
    r = torch.randn(37, 96, generator=gen).to(dtype) if residual else None
    got, want = cpu_ops.rmsnorm_cpu(x, w, 1e-6, r), rmsnorm_ref(x, w, 1e-6, r)
    if residual:
        _close(got[0], want[0], dtype)
        assert torch.equal(got[1], want[1]), "the residual sum is one rounding of x + residual"
    else:
        _close(got, want, dtype)


def test_rmsnorm_per_head_strided() -> None:
    """q/k norms see [T, H, D] views of the fused qkv output."""
    qkv = torch.randn(9, 3 * 4 * 16)
    q = qkv[:, : 4 * 16].view(9, 4, 16)
    w = torch.rand(16)
    _close(cpu_ops.rmsnorm_cpu(q, w, 1e-6), rmsnorm_ref(q, w, 1e-6), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(21, (8 + 2 * 2) * 32, generator=gen).to(dtype)
    q, k, _ = qkv.split([8 * 32, 2 * 32, 2 * 32], -1)
    q, k = q.view(21, 8, 32), k.view(21, 2, 32)
    pos = torch.randint(0, 500, (21,), generator=gen)
    ang = torch.outer(torch.arange(512).float(), torch.rand(16, generator=gen))
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    want_q, want_k = rotary_ref(pos, q.clone(), k.clone(), cos, sin)
    got_q, got_k = cpu_ops.rotary_cpu(pos, q, k, cos, sin)
    assert got_q.data_ptr() == q.data_ptr(), "rotates in place"
    _close(got_q, want_q, dtype)
    _close(got_k, want_k, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype: torch.dtype) -> None:
    x = torch.randn(13, 2 * 88, generator=torch.Generator().manual_seed(2)).to(dtype)
    _close(cpu_ops.silu_and_mul_cpu(x), silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [50257, 17, 1])
def test_argmax_equals_torch_max_indices(dtype: torch.dtype, width: int) -> None:
    """First index of the maximum on ties, NaN wins, all -inf rows give 0; odd widths."""
    gen = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(12, width, generator=gen)).round().to(dtype)  # rounding makes ties
    x[1] = float("-inf")
    x[2, width // 2] = float("nan")
    x[3, -1] = 1000
    x[4, 0] = 1000
    assert torch.equal(cpu_ops.argmax_cpu(x), x.max(-1).indices)
    assert torch.equal(cpu_ops.argmax_cpu(x[:, :width]), x.max(-1).indices)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float8_e4m3fn])
def test_store_kv_writes_what_the_reference_writes(dtype: torch.dtype) -> None:
    """k and v as the fused qkv output's strided views (each token's row contiguous), into
    scattered slots, the rest of the pool untouched; a slot outside the pool is refused."""
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(5, 6 * 16, generator=gen).to(dtype)
    k, v = qkv[:, 32:64].view(5, 2, 16), qkv[:, 64:].view(5, 2, 16)
    slots = torch.tensor([9, 2, 30, 0, 17])
    k_pool, v_pool = (torch.randn(31, 2, 16, generator=gen).to(dtype) for _ in range(2))
    pools = [k_pool, v_pool, k_pool.clone(), v_pool.clone()]
    cpu_ops.store_kv_cpu(pools[0], pools[1], slots, k, v)
    store_kv_ref(pools[2], pools[3], slots, k, v)
    assert torch.equal(pools[0].view(torch.uint8), pools[2].view(torch.uint8))
    assert torch.equal(pools[1].view(torch.uint8), pools[3].view(torch.uint8))
    with pytest.raises(RuntimeError, match="outside the pool"):
        cpu_ops.store_kv_cpu(pools[0], pools[1], torch.tensor([0, 1, 2, 3, 31]), k, v)


def test_unbuildable_falls_back_to_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_ops, "_ops", None)
    x = torch.randn(4, 8)
    assert torch.equal(cpu_ops.silu_and_mul_cpu(x), silu_and_mul_ref(x))
