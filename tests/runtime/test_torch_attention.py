"""The torch attention backend (the CPU paged-attention kernel, page-granular gathers, cascade
over shared prefixes, explicit matmuls for short queries, SDPA for long prefills) equals the
per-request reference in fp32, for page sizes 1 and 16, MHA and GQA, and batches mixing
decode, extend and prefill rows, with the CPU kernel and without it."""

from __future__ import annotations

import pytest
import torch

from arbor.kernels.reference import extend_attention_ref
from arbor.runtime.kv.pool import KVPool, PageAllocator, ReqToTokenPool, reserve_positions
from arbor.runtime.model.attention.cascade import MIN_SHARED, find_shared_prefixes
from arbor.runtime.model.attention.torch_backend import TorchAttnBackend
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode

D = 16


def _setup(page_size: int, hkv: int, reqs: list[tuple[int, int, int]], seed: int = 0):
    """reqs: (request whose row to share, shared prefix length, own cached length, new
    tokens). Returns the backend, the batch, the pool and the table."""
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(4096, 1, hkv, D, torch.float32, torch.device("cpu"))
    pool.k[0].copy_(torch.randn(pool.k[0].shape, generator=gen))
    pool.v[0].copy_(torch.randn(pool.v[0].shape, generator=gen))
    alloc = PageAllocator(4096, page_size)
    r2t = ReqToTokenPool(len(reqs), 1024, torch.device("cpu"), page_size)
    rows = [r2t.alloc() for _ in reqs]
    prefix_lens = []
    for i, (src, shared, own, _) in enumerate(reqs):
        if shared:
            r2t.table[rows[i], :shared] = r2t.table[rows[src], :shared]
        if own:
            reserve_positions(r2t, alloc, [rows[i]], [shared], [shared + own])
        prefix_lens.append(shared + own)
    new = [[0] * n for *_, n in reqs]
    loc = reserve_positions(r2t, alloc, rows, prefix_lens, [p + len(n) for p, n in zip(prefix_lens, new)])
    mode = ForwardMode.DECODE if all(n == 1 for *_, n in reqs) else ForwardMode.MIXED
    batch = ForwardBatch.build(mode, new, prefix_lens, rows, loc, r2t.table)
    return TorchAttnBackend(pool, r2t, D**-0.5), batch, pool, r2t


def _reference(pool: KVPool, r2t: ReqToTokenPool, batch: ForwardBatch, q, k, v) -> torch.Tensor:
    pre = batch.prefix_lens
    kv_indptr = torch.zeros(pre.numel() + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(pre, 0)
    width = int(pre.max()) if pre.numel() else 0
    table = r2t.table[batch.req_pool_indices, :width]
    indices = table[torch.arange(width)[None, :] < pre[:, None]].to(torch.int64)
    return extend_attention_ref(
        q, k, v, pool.k[0], pool.v[0], batch.qo_indptr, kv_indptr, indices, D**-0.5, int(batch.extend_lens.max())
    )


CASES = {
    # W2-like decode: one long shared prefix, own suffixes of different lengths
    "decode-shared": [(0, 0, 160, 1), (0, 160, 5, 1), (0, 160, 40, 1), (0, 144, 0, 1), (0, 0, 70, 1)],
    # mixed: decode rows, short extends after the shared prefix, a long prefill, no-prefix rows
    "mixed": [(0, 0, 130, 3), (0, 128, 0, 1), (0, 128, 17, 20), (0, 0, 0, 40), (0, 0, 9, 1), (0, 128, 2, 5)],
    # every row after one shared prefix (W2 exactly): the prefix's part is the kernel's prior
    "decode-all-shared": [(0, 0, 160, 1), (0, 160, 5, 1), (0, 160, 40, 1), (0, 144, 0, 1)],
    # plain decode, nothing shared: the kernel alone, reading q in place
    "decode-private": [(0, 0, 30, 1), (0, 0, 70, 1), (0, 0, 5, 1), (0, 0, 200, 1)],
    "two-prefixes": [(0, 0, 96, 1), (0, 96, 3, 1), (0, 0, 0, 1), (0, 0, 0, 33), (4, 0, 80, 1), (4, 64, 20, 2)],
}


@pytest.mark.parametrize("kernel", [True, False], ids=["cpu-kernel", "torch-only"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (8, 2)])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("gathered", [False, True], ids=["prefix-view", "prefix-gathered"])
def test_backend_equals_reference(page_size: int, hq: int, hkv: int, case: str, kernel: bool, gathered: bool) -> None:
    backend, batch, pool, r2t = _setup(page_size, hkv, CASES[case])
    if kernel:
        assert backend.ops is not None, "the CPU kernels build on this machine (a compiler is present)"
    else:
        backend.ops = None
    gen = torch.Generator().manual_seed(1)
    t = int(batch.extend_lens.sum())
    q, k, v = (torch.randn(t, h, D, generator=gen) for h in (hq, hkv, hkv))
    backend.init_forward_metadata(batch)
    shared = {"two-prefixes": 2, "decode-private": 0}.get(case, 1)
    assert len(backend.shared) == shared, "the case exercises the cascade (or, without sharing, not)"
    assert all(sp.first_page >= 0 for sp in backend.shared), "a prefix reserved at once has consecutive pages"
    if gathered:
        for sp in backend.shared:
            sp.first_page = -1
    assert backend.ops is None or backend.kernel_all == case.startswith("decode")
    got = backend.forward(q, k, v, 0, batch).view(t, hq, D)
    want = _reference(pool, r2t, batch, q, k, v)
    assert (got - want).abs().max().item() < 1e-5


def test_shared_prefix_detection_counts_whole_pages_of_equal_slots() -> None:
    _, batch, _, r2t = _setup(16, 2, [(0, 0, 150, 1), (0, 150, 4, 1), (0, 100, 0, 1), (0, 0, 80, 1)])
    found = find_shared_prefixes(batch, r2t.table, 16)
    assert len(found) == 1
    assert found[0].members.tolist() == [0, 1, 2]
    assert found[0].length == 96  # 100 shared positions, rounded down to whole pages
    assert found[0].length >= MIN_SHARED
