"""Linear layers with oneDNN-packed weights, for bf16 matmuls on CPUs.

torch's bf16 `F.linear` on a CPU hands oneDNN a plain row-major weight, which oneDNN
reorders into its blocked layout on every call. Packing once at load time
(`torch.ops.mkldnn._reorder_linear_weight`, what inductor's CPU freezing does) halves the
decode-size matmuls (a 512 x 2,752 projection at 8 rows: 0.10 -> 0.044 ms; the 50,257-row
LM head at 64 rows: 3.3 -> 1.8 ms) and gives the same bits (tests/runtime/test_packed.py).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


class PackedLinear(nn.Module):
    """`F.linear(x, weight, bias)` over a weight packed once for oneDNN."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    """bf16 on a CPU with oneDNN: where packing gives the same bits, faster."""
    return device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


def pack_linears(model: nn.Module) -> int:
    """Swap every nn.Linear of `model` for a PackedLinear (dropping the plain weight); the
    number swapped. A model whose LM head is tied to the embedding gets `packed_head`, a
    packed copy (the embedding keeps its plain weight for lookups)."""
    swaps = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child.weight, child.bias))
    embed = getattr(model, "embed_tokens", None)
    if hasattr(model, "packed_head") and getattr(model, "lm_head", None) is None and embed is not None:
        model.packed_head = PackedLinear(embed.weight, None)
    return len(swaps)
