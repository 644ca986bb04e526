"""The capture/replay hooks of AttentionBackend, shown on a fake backend that implements them
and a tiny driver in the place of a CUDA-graph runner: static buffers sized once at capture,
each real decode batch replayed in the smallest captured size that holds it, its padding rows
reading and writing only the reserved dummy slot 0. Replays equal the torch backend's eager
attention. On CUDA the driver records real CUDA graphs; on CPUs it calls the step again."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from arbor.runtime.kv.pool import KVPool, PageAllocator, ReqToTokenPool, reserve_positions
from arbor.runtime.model.attention.base import AttentionBackend
from arbor.runtime.model.attention.torch_backend import TorchAttnBackend
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HQ, HKV, D, CONTEXT, SIZES = 4, 2, 8, 64, (1, 2, 4, 8)
Meta = tuple[torch.Tensor, torch.Tensor]  # seq_lens [B], KV slots [B, CONTEXT] (0 past the end)


class DenseCaptureBackend(AttentionBackend):
    """Decode attention over a dense [B, CONTEXT] slot table; graph-safe (no host syncs)."""

    supports_capture = True

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self.meta = (batch.seq_lens, self.req_to_token.table[batch.req_pool_indices].long())

    def init_capture(self, max_batch_size: int) -> None:
        dev = self.req_to_token.table.device
        self.seq_lens = torch.ones(max_batch_size, dtype=torch.int64, device=dev)
        self.slots = torch.zeros(max_batch_size, self.req_to_token.max_context_len, dtype=torch.int64, device=dev)
        self.views: dict[int, Meta] = {}

    def prepare_for_capture(self, batch: ForwardBatch) -> None:
        n = batch.batch_size
        self.views[n] = (self.seq_lens[:n], self.slots[:n])
        self.prepare_for_replay(batch, n)

    def prepare_for_replay(self, batch: ForwardBatch, padded_size: int) -> None:
        n = batch.batch_size
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.slots[:n].copy_(self.req_to_token.table[batch.req_pool_indices])
        self.seq_lens[n:padded_size].fill_(1)
        self.slots[n:padded_size].zero_()
        self.meta = self.views[padded_size]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, batch: ForwardBatch
    ) -> torch.Tensor:
        assert batch.mode is ForwardMode.DECODE
        self.kv_pool.store(layer, batch.out_cache_loc, k, v)
        seq_lens, slots = self.meta
        q = q.view(q.shape[0], k.shape[1], -1, q.shape[2])  # [B, Hkv, group, D]
        keys, values = self.kv_pool.k[layer][slots], self.kv_pool.v[layer][slots]  # [B, W, Hkv, D]
        scores = torch.einsum("bkgd,bwkd->bkgw", q, keys) * self.scale
        past = torch.arange(slots.shape[1], device=q.device)[None, :] >= seq_lens[:, None]
        probs = scores.masked_fill(past[:, None, None, :], float("-inf")).softmax(-1)
        return torch.einsum("bkgw,bwkd->bkgd", probs, values).reshape(q.shape[0], -1)


def record(step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """Record `step` once; the result replays it. A CUDA graph on CUDA (the same kernels on the
    same memory); on CPUs the step itself, which reads only static buffers."""
    if DEVICE.type != "cuda":
        step()
        return step
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return lambda: (graph.replay(), out)[1]


class DecodeGraphs:
    """A tiny graph runner: static inputs, one recorded step per size, padded replays."""

    def __init__(self, backend: AttentionBackend, sizes: tuple[int, ...]) -> None:
        assert backend.supports_capture
        self.backend, self.sizes, big = backend, sizes, max(sizes)
        backend.init_capture(big)
        self.q = torch.zeros(big, HQ, D, device=DEVICE)
        self.k = torch.zeros(big, HKV, D, device=DEVICE)
        self.v = torch.zeros(big, HKV, D, device=DEVICE)
        self.out_cache_loc = torch.zeros(big, dtype=torch.int64, device=DEVICE)
        self.steps = {n: self._capture(n) for n in sizes}

    def _capture(self, n: int) -> Callable[[], torch.Tensor]:
        table = self.backend.req_to_token.table
        batch = ForwardBatch.build(ForwardMode.DECODE, [[0]] * n, [0] * n, [0] * n, self.out_cache_loc[:n], table)
        assert batch.out_cache_loc.data_ptr() == self.out_cache_loc.data_ptr()  # a view, not a copy
        self.backend.prepare_for_capture(batch)
        return record(lambda: self.backend.forward(self.q[:n], self.k[:n], self.v[:n], 0, batch))

    def replay(self, batch: ForwardBatch, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = batch.batch_size
        size = min(s for s in self.sizes if s >= n)
        for static, real in (
            (self.q, q),
            (self.k, k),
            (self.v, v),
            (self.out_cache_loc, batch.out_cache_loc),
        ):
            static[:n].copy_(real)
            static[n:size].zero_()
        self.backend.prepare_for_replay(batch, size)
        return self.steps[size]()[:n]


def _pools_and_table(page_size: int) -> tuple[KVPool, KVPool, ReqToTokenPool, PageAllocator]:
    gen = torch.Generator().manual_seed(0)
    pools = [KVPool(512, 1, HKV, D, torch.float32, DEVICE) for _ in range(2)]
    for cache in (pools[0].k[0], pools[0].v[0]):
        cache.copy_(torch.randn(cache.shape, generator=gen))
    pools[1].k[0].copy_(pools[0].k[0])
    pools[1].v[0].copy_(pools[0].v[0])
    return (
        pools[0],
        pools[1],
        ReqToTokenPool(8, CONTEXT, DEVICE, page_size),
        PageAllocator(512, page_size),
    )


def _decode_batch(r2t: ReqToTokenPool, alloc: PageAllocator, cached: list[int]) -> ForwardBatch:
    rows = [r2t.alloc() for _ in cached]
    assert None not in rows
    reserve_positions(r2t, alloc, rows, [0] * len(rows), cached)
    loc = reserve_positions(r2t, alloc, rows, cached, [c + 1 for c in cached])
    assert loc is not None
    return ForwardBatch.build(ForwardMode.DECODE, [[0]] * len(rows), cached, rows, loc, r2t.table)


def _qkv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, h, D, generator=gen).to(DEVICE) for h in (HQ, HKV, HKV))


def test_a_backend_without_the_hooks_says_it_cannot_capture():
    pool, _, r2t, _ = _pools_and_table(1)
    backend = TorchAttnBackend(pool, r2t, D**-0.5)
    assert not backend.supports_capture
    with pytest.raises(NotImplementedError, match="TorchAttnBackend does not capture"):
        backend.init_capture(4)


@pytest.mark.parametrize("page_size", [1, 4])
def test_padded_replays_equal_eager_attention_and_touch_only_slot_0(page_size):
    eager_pool, graph_pool, r2t, alloc = _pools_and_table(page_size)
    eager = TorchAttnBackend(eager_pool, r2t, D**-0.5)
    graphs = DecodeGraphs(DenseCaptureBackend(graph_pool, r2t, D**-0.5), SIZES)
    backend = graphs.backend
    buffers = [t.data_ptr() for t in (backend.seq_lens, backend.slots, graphs.q, graphs.out_cache_loc)]
    for seed, cached in enumerate([[5, 17, 9, 30, 2], [12, 3, 40], [7]]):  # sizes 8, 4 and 1
        batch = _decode_batch(r2t, alloc, cached)
        q, k, v = _qkv(len(cached), seed)
        eager.init_forward_metadata(batch)
        want = eager.forward(q, k, v, 0, batch)
        got = graphs.replay(batch, q, k, v)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        size = min(s for s in SIZES if s >= len(cached))
        assert backend.seq_lens[len(cached) : size].eq(1).all() and backend.slots[len(cached) : size].eq(0).all()
        for ours, theirs in (
            (graph_pool.k[0], eager_pool.k[0]),
            (graph_pool.v[0], eager_pool.v[0]),
        ):
            assert torch.equal(ours[1:], theirs[1:])  # padding wrote nothing but slot 0
        for row in batch.req_pool_indices.tolist():
            r2t.free(row)
    assert [t.data_ptr() for t in (backend.seq_lens, backend.slots, graphs.q, graphs.out_cache_loc)] == buffers
