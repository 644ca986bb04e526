"""The token embedding and the LM head, split over tensor-parallel ranks by vocabulary: each
rank holds a contiguous range of `ceil(vocab / size)` ids (parallel.py), the last padded."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arbor.runtime.model.layers.linear import ParallelLinear, pack_weight, packed_matmul
from arbor.runtime.model.layers.weight_layer import ShardId, WeightLayer, copy_checked
from arbor.runtime.model.parallel import TensorParallel
from arbor.runtime.model.weights.base import Part


class VocabParallelEmbedding(WeightLayer):
    """This rank's rows of the embedding; ids outside its range look up zeros, and the
    all-reduce fills them in from the rank that owns them."""

    def __init__(self, vocab: int, hidden: int, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.lo, self.hi = tp.vocab_range(vocab)
        self.num_embeddings = tp.vocab_rows(vocab)
        self.weight = nn.Parameter(torch.empty(self.num_embeddings, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.lo
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(outside[:, None], 0))

    def checkpoint_part(self, param: str, shard_id: ShardId = None) -> Part | None:
        return vocab_slice(self.tp, self.lo, self.hi)

    def weight_loader(self, param: str, tensor: torch.Tensor, shard_id: ShardId = None) -> None:
        load_vocab_rows(self.parameter(param), tensor)


class ParallelLMHead(ParallelLinear):
    """An LM head of its own: this rank's rows of the output projection (logits of its ids)."""

    def __init__(self, vocab: int, hidden: int, tp: TensorParallel) -> None:
        super().__init__(hidden, tp.vocab_rows(vocab), False, tp)
        self.lo, self.hi = tp.vocab_range(vocab)

    def checkpoint_part(self, param: str, shard_id: ShardId = None) -> Part | None:
        return vocab_slice(self.tp, self.lo, self.hi)

    def weight_loader(self, param: str, tensor: torch.Tensor, shard_id: ShardId = None) -> None:
        load_vocab_rows(self.parameter(param), tensor)


class TiedLMHead(WeightLayer):
    """An LM head tied to the embedding: logits through the embedding's weight. It loads
    nothing (a tied checkpoint may still ship a copy of the embedding, which is skipped);
    `pack` makes a packed copy and leaves the embedding its plain weight for lookups."""

    def __init__(self, embedding: VocabParallelEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.packed: torch.Tensor | None = None

    @property
    def weight(self) -> torch.Tensor:
        """The embedding's weight: [rows, hidden]."""
        return self.embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_matmul(hidden, self.packed, None)
        return hidden @ self.embedding.weight.T

    def pack(self) -> None:
        """Multiply through a oneDNN-packed copy of the embedding's weight from now on."""
        self.packed = pack_weight(self.embedding.weight)

    def weight_loader(self, param: str, tensor: torch.Tensor, shard_id: ShardId = None) -> None:
        """The checkpoint's copy of a tied head: the embedding already holds it."""


def vocab_slice(tp: TensorParallel, lo: int, hi: int) -> Part | None:
    """Rows [lo, hi) of a vocabulary-sized checkpoint tensor: this rank's token ids."""
    return None if tp.size == 1 else (0, lo, hi)


def load_vocab_rows(dest: torch.Tensor, tensor: torch.Tensor) -> None:
    """dest <- tensor; the last rank's slice is shorter than its rows, and the rest are zeros."""
    if tensor.shape[0] < dest.shape[0]:
        dest[tensor.shape[0] :].zero_()
        dest = dest[: tensor.shape[0]]
    copy_checked(dest, tensor)
