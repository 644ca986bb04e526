"""WeightSource: where a checkpoint's tensors come from, one class per on-disk format."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

Part = tuple[int, int, int]  # (dim, lo, hi): rows (dim 0) or columns (dim 1) lo..hi of a tensor
Shard = Callable[[str], Part | None]  # HF tensor name -> the part this rank holds; None: all of it


class WeightSource(ABC):
    """The tensors of one checkpoint in one format, read for one rank.

    Contract: `tensors` yields each tensor of the checkpoint once, under its Hugging Face
    name (`model.layers.0.self_attn.q_proj.weight`), in the checkpoint's own dtype (the model
    converts as it copies), on `device`. Where `shard(name)` gives a part, only that part is
    yielded (read alone where the format allows it, so a rank never holds the whole tensor).
    Opening a path that lacks the format's files raises CheckpointError naming what is missing.
    """

    expects: ClassVar[str]  # what a checkpoint in this format holds, for error messages

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    @abstractmethod
    def holds(cls, path: Path) -> bool:
        """Whether `path` holds a checkpoint in this format (what --load-format auto asks)."""

    @abstractmethod
    def tensors(self, device: torch.device, shard: Shard | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Every (HF name, tensor) pair of the checkpoint, cut by `shard` (see the class)."""


def cut(tensor: torch.Tensor, part: Part | None) -> torch.Tensor:
    """`part` of a whole tensor (all of it for None): for formats that cannot read a slice."""
    if part is None:
        return tensor
    dim, lo, hi = part
    return tensor[lo:hi] if dim == 0 else tensor[:, lo:hi]
