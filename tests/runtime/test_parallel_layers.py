"""Each tensor-parallel layer, loaded on two ranks from the parts of the checkpoint tensors its
`checkpoint_part` names, computes what the unsplit layer computes: column-parallel outputs side
by side, row-parallel partial products summed, vocabulary rows where each rank owns them (the
last rank's padding zero). No processes: the collectives are done by hand."""

from __future__ import annotations

import pytest
import torch

from arbor.runtime.model.layers import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    WeightLayer,
)
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.model.weights import cut

RANKS = [TensorParallel(0, 2), TensorParallel(1, 2)]
GEN = torch.Generator().manual_seed(0)


def _loaded(layer: WeightLayer, tensors: dict[tuple[str, str | int | None], torch.Tensor]) -> WeightLayer:
    """`layer` filled as the loader fills it: each tensor cut to the part the layer names."""
    for (param, shard_id), tensor in tensors.items():
        layer.weight_loader(param, cut(tensor, layer.checkpoint_part(param, shard_id)), shard_id)
    assert layer.expected_weights() == set(tensors)
    return layer


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN)


def test_column_parallel_ranks_give_the_output_side_by_side() -> None:
    tensors = {("weight", None): _rand(12, 8), ("bias", None): _rand(12)}
    x = _rand(5, 8)
    whole = _loaded(ColumnParallelLinear(8, 12, True, SINGLE), tensors)(x)
    parts = [_loaded(ColumnParallelLinear(8, 12, True, tp), tensors)(x) for tp in RANKS]
    torch.testing.assert_close(torch.cat(parts, -1), whole)


def test_merged_column_parallel_ranks_hold_their_block_of_each_part() -> None:
    tensors = {("weight", 0): _rand(10, 8), ("weight", 1): _rand(10, 8)}
    x = _rand(3, 8)
    whole = _loaded(MergedColumnParallelLinear(8, [10, 10], False, SINGLE), tensors)(x)
    gate, up = zip(
        *(_loaded(MergedColumnParallelLinear(8, [10, 10], False, tp), tensors)(x).split(5, -1) for tp in RANKS)
    )
    torch.testing.assert_close(torch.cat([*gate, *up], -1), whole)


@pytest.mark.parametrize("kv_heads", [2, 1])  # 1: the KV head replicated on both ranks
def test_qkv_parallel_ranks_hold_their_heads(kv_heads: int) -> None:
    hd, heads = 3, 4
    tensors = {("weight", s): _rand(n * hd, 8) for s, n in zip("qkv", (heads, kv_heads, kv_heads))}
    tensors |= {("bias", s): _rand(n * hd) for s, n in zip("qkv", (heads, kv_heads, kv_heads))}
    x = _rand(2, 8)
    q, k, v = _loaded(QKVParallelLinear(8, hd, heads, kv_heads, True, SINGLE), tensors)(x).split(
        [heads * hd, kv_heads * hd, kv_heads * hd], -1
    )
    kv = max(kv_heads // 2, 1) * hd
    ranks = [
        _loaded(QKVParallelLinear(8, hd, heads, kv_heads, True, tp), tensors)(x).split([2 * hd, kv, kv], -1)
        for tp in RANKS
    ]
    torch.testing.assert_close(torch.cat([r[0] for r in ranks], -1), q)
    for i, whole in ((1, k), (2, v)):
        got = ranks[0][i] if kv_heads == 1 else torch.cat([r[i] for r in ranks], -1)
        torch.testing.assert_close(got, whole)
        if kv_heads == 1:
            torch.testing.assert_close(ranks[1][i], whole)


def test_row_parallel_partial_products_sum_to_the_output() -> None:
    tensors = {("weight", None): _rand(6, 12)}
    x = _rand(4, 12)
    whole = _loaded(RowParallelLinear(12, 6, SINGLE), tensors)(x)
    layers = [_loaded(RowParallelLinear(12, 6, tp), tensors) for tp in RANKS]
    # each rank's matmul over its columns of x, before the all-reduce that RowParallelLinear adds
    partial = [ParallelLinear.forward(layer, x[:, 6 * r : 6 * (r + 1)]) for r, layer in enumerate(layers)]
    torch.testing.assert_close(partial[0] + partial[1], whole)


def test_vocab_parallel_rows_are_each_ranks_ids_and_the_last_rank_is_padded() -> None:
    table = _rand(11, 4)  # an odd vocabulary: rank 1 holds 5 ids in 6 rows
    embeds = [_loaded(VocabParallelEmbedding(11, 4, tp), {("weight", None): table}) for tp in RANKS]
    assert torch.equal(torch.cat([e.weight for e in embeds])[:11], table)
    assert not embeds[1].weight[-1].any()
    x = _rand(3, 4)
    heads = [_loaded(ParallelLMHead(11, 4, tp), {("weight", None): table}) for tp in RANKS]
    logits = torch.cat([ParallelLinear.forward(head, x) for head in heads], -1)[:, :11]
    torch.testing.assert_close(logits, x @ table.T)
