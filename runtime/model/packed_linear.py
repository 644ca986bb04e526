"""Linear layers with oneDNN-packed weights, for bf16 matmuls on CPUs.

torch's bf16 `F.linear` on a CPU hands oneDNN a plain row-major weight, which oneDNN
reorders into its blocked layout on every call. Packing once at load time
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's CPU freezing does) halves the
decode-size matmuls (a 512 x 2,752 projection at 8 rows: 0.10 -> 0.044 ms; the 50,257-row
LM head at 64 rows: 3.3 -> 1.8 ms) and gives the same bits (tests/runtime/test_packed.py).
"""

from __future__ import annotations

import torch
from torch import nn

from arbor.runtime.model.layers import ParallelLinear, TiedLMHead
from arbor.runtime.model.layers.linear import pack_weight, packed_matmul


class PackedLinear(nn.Module):
    """`F.linear(x, weight, bias)` over a weight packed once for oneDNN."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed = pack_weight(weight)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_matmul(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """bf16 on a CPU with oneDNN: where packing gives the same bits, faster."""
    return device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


def pack_linears(model: nn.Module) -> int:
    """Pack every linear layer of `model`, the LM head included; the number packed. Arbor's
    layers pack their own weight (a head tied to the embedding packs a copy: the embedding
    keeps its plain weight for lookups); a plain nn.Linear (a draft's FrequentTokenHead) is
    swapped for a PackedLinear."""
    layers = [m for m in model.modules() if isinstance(m, (ParallelLinear, TiedLMHead))]
    for layer in layers:
        layer.pack()
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child.weight, child.bias))
    return len(layers) + len(swaps)
