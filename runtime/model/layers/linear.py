"""Linear layers split over tensor-parallel ranks (Megatron's split, see parallel.py), each
loading its own slice of the checkpoint.

Column-parallel layers hold a contiguous block of output rows per rank; the fused ones
(q/k/v, gate/up) hold a block of each checkpoint tensor fused into them, in order.
Row-parallel layers hold a block of input columns and sum the ranks' partial products.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.layers.weight_layer import ShardId, WeightLayer, copy_checked
from arbor.runtime.model.parallel import TensorParallel
from arbor.runtime.model.weights.base import Part


class LinearLayer(WeightLayer, ABC):
    """y = x W^T (+ b) over this rank's `in_features` x `out_features` share of W, in whatever
    form W is held (dense here, quantized in quant/linear.py)."""

    in_features: int
    out_features: int

    @abstractmethod
    def output_shards(self) -> list[tuple[ShardId, int, int]]:
        """The checkpoint tensors fused into this layer's output rows: (shard id, first row,
        rows), in order; one part (None, 0, out_features) where nothing is fused."""


class ParallelLinear(LinearLayer):
    """A dense linear layer; the subclasses say which slice of the checkpoint each rank holds.
    `pack` swaps in a oneDNN-packed copy of the weight for CPU bf16 matmuls (packed_linear.py)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__()
        self.in_features, self.out_features, self.tp = in_features, out_features, tp
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_matmul(x, self.packed, self.bias)
        return F.linear(x, self.weight, self.bias)

    def pack(self) -> None:
        """Multiply through a oneDNN-packed copy of the weight from now on; the plain one is dropped."""
        self.packed = pack_weight(self.weight)
        self.register_parameter("weight", None)

    def output_shards(self) -> list[tuple[ShardId, int, int]]:
        return [(None, 0, self.out_features)]

    def weight_loader(self, param: str, tensor: torch.Tensor, shard_id: ShardId = None) -> None:
        """Copy `tensor` into the rows of `param` that shard `shard_id` fills."""
        for part, lo, rows in self.output_shards():
            if part == shard_id:
                return copy_checked(self.parameter(param)[lo : lo + rows], tensor)
        raise CheckpointError(f"{type(self).__name__} fuses no part {shard_id!r}")

    def expected_weights(self) -> set[tuple[str, ShardId]]:
        return {(name, part) for name, _ in self.named_parameters(recurse=False) for part, _, _ in self.output_shards()}

    def extra_repr(self) -> str:
        packed = ", packed" if self.packed is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{packed}"


class ColumnParallelLinear(ParallelLinear):
    """Each rank holds `out_features / size` consecutive output rows (weight and bias)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__(in_features, out_features // tp.size, bias, tp)

    def checkpoint_part(self, param: str, shard_id: ShardId = None) -> Part | None:
        rows = self.out_features
        return None if self.tp.size == 1 else (0, self.tp.rank * rows, (self.tp.rank + 1) * rows)


class MergedColumnParallelLinear(ParallelLinear):
    """Several column-parallel projections of the same input fused into one matmul (gate and
    up): checkpoint tensor i (shard id i) fills this rank's block of its `sizes[i]` rows."""

    def __init__(self, in_features: int, sizes: list[int], bias: bool, tp: TensorParallel) -> None:
        self.sizes = [size // tp.size for size in sizes]  # this rank's rows of each
        super().__init__(in_features, sum(self.sizes), bias, tp)

    def checkpoint_part(self, param: str, shard_id: ShardId = None) -> Part | None:
        rows = self.sizes[int(shard_id or 0)]
        return None if self.tp.size == 1 else (0, self.tp.rank * rows, (self.tp.rank + 1) * rows)

    def output_shards(self) -> list[tuple[ShardId, int, int]]:
        starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        return [(i, lo, rows) for i, (lo, rows) in enumerate(zip(starts, self.sizes))]


class QKVParallelLinear(ParallelLinear):
    """The q, k and v projections fused (shard ids "q", "k", "v"): each rank holds its
    `num_heads / size` query heads and the KV heads they read (parallel.py: fewer KV heads than
    ranks are replicated)."""

    def __init__(
        self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool, tp: TensorParallel
    ) -> None:
        self.head_dim = head_dim
        self.num_heads, self.num_kv_heads = num_heads // tp.size, tp.kv_heads(num_kv_heads)
        self.kv_head_start = tp.kv_head_start(num_kv_heads)
        super().__init__(hidden, (self.num_heads + 2 * self.num_kv_heads) * head_dim, bias, tp)

    def checkpoint_part(self, param: str, shard_id: ShardId = None) -> Part | None:
        if self.tp.size == 1:
            return None
        first = self.tp.rank * self.num_heads if shard_id == "q" else self.kv_head_start
        heads = self.num_heads if shard_id == "q" else self.num_kv_heads
        return (0, first * self.head_dim, (first + heads) * self.head_dim)

    def output_shards(self) -> list[tuple[ShardId, int, int]]:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return [("q", 0, q), ("k", q, kv), ("v", q + kv, kv)]


class RowParallelLinear(ParallelLinear):
    """Each rank holds `in_features / size` consecutive input columns and computes a partial
    product; the all-reduce sums them. No bias (the ranks' partial sums would add it `size` times)."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel) -> None:
        super().__init__(in_features // tp.size, out_features, False, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))

    def checkpoint_part(self, param: str, shard_id: ShardId = None) -> Part | None:
        cols = self.in_features
        return None if self.tp.size == 1 else (1, self.tp.rank * cols, (self.tp.rank + 1) * cols)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` reordered once into oneDNN's blocked layout (what inductor's CPU freezing does)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) over the weight `pack_weight` packed."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")
