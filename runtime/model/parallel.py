"""Tensor parallelism over torch.distributed (gloo on CPUs, NCCL on GPUs): which slice of
each checkpoint tensor a rank holds, and the collectives that join the slices.

Megatron's split: q/k/v and gate/up are column-parallel (each rank computes its heads or its
share of the intermediate), o and down are row-parallel (partial sums, then an all-reduce),
the embedding and the LM head are vocab-parallel (each rank owns a contiguous range of
`ceil(vocab / size)` ids). KV heads are split like q heads; where there are fewer KV heads than
ranks, each rank keeps the one KV head its q heads read (replicated across ranks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from arbor.runtime.model.errors import CheckpointError


@dataclass
class TensorParallel:
    """This process's rank among `size`; size 1 is the single-device model (no collectives).
    `collective_s` adds up the wall time spent in collectives (waits for slower ranks
    included; on CUDA, NCCL's launch time only)."""

    rank: int = 0
    size: int = 1
    collective_s: float = field(default=0.0, compare=False)

    def check(self, num_heads: int, num_kv_heads: int, intermediate: int) -> None:
        """Refuse shapes that do not split evenly across the ranks."""
        n = self.size
        if num_heads % n or intermediate % n or (num_kv_heads % n and n % num_kv_heads):
            raise CheckpointError(
                f"--tp-size {n} must divide the {num_heads} attention heads and the "
                f"{intermediate} MLP columns, and divide or be a multiple of the "
                f"{num_kv_heads} KV heads"
            )

    def kv_heads(self, total: int) -> int:
        """KV heads this rank holds."""
        return max(total // self.size, 1)

    def kv_head_start(self, total: int) -> int:
        """The first KV head this rank holds (ranks share a head when total < size)."""
        return self.rank * total // self.size

    def vocab_range(self, vocab: int) -> tuple[int, int]:
        """The token ids [lo, hi) this rank's embedding and LM head rows cover."""
        per = -(-vocab // self.size)
        lo = min(self.rank * per, vocab)
        return lo, min(lo + per, vocab)

    def vocab_rows(self, vocab: int) -> int:
        """Rows of this rank's embedding / LM head (every rank the same, the last padded)."""
        return -(-vocab // self.size)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        if self.size > 1:
            start = time.perf_counter()
            dist.all_reduce(x)
            self.collective_s += time.perf_counter() - start
        return x

    def gather_vocab(self, logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """[N, rows] per rank -> [N, vocab]: the ranks' logits side by side, padding dropped."""
        if self.size == 1:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.size)]
        start = time.perf_counter()
        dist.all_gather(parts, logits.contiguous())
        self.collective_s += time.perf_counter() - start
        return torch.cat(parts, -1)[:, :vocab]


SINGLE = TensorParallel()  # one process, the whole model
