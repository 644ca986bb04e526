"""Swap a model's linear layers for QuantLinear where its checkpoint is quantized."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.quant.config import QuantConfig
from arbor.runtime.model.quant.linear import QuantLinear

# Our linear layer's name -> the checkpoint layers fused into it: (HF name, first row, rows).
PartsOf = Callable[[str], list[tuple[str, int, int]]]


def quantize_linears(model: nn.Module, qc: QuantConfig, parts_of: PartsOf) -> int:
    """Replace each nn.Linear whose checkpoint layers are quantized (call on the meta-device
    model, before its weights load); the number replaced."""
    swaps = []
    for parent_name, parent in model.named_modules():
        for child_name, child in parent.named_children():
            if not isinstance(child, nn.Linear):
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            parts = parts_of(name)
            schemes = {qc.scheme_for(hf) for hf, _, _ in parts}
            if schemes == {None}:
                continue
            if len(schemes) > 1:
                raise CheckpointError(f"{name}: the layers fused into it ({', '.join(p[0] for p in parts)}) are "
                                      "quantized differently; Arbor fuses them, so they must match")
            layer = QuantLinear(child.in_features, child.out_features, child.bias is not None, schemes.pop(),
                                [(lo, rows) for _, lo, rows in parts])
            swaps.append((parent, child_name, layer))
    for parent, child_name, layer in swaps:
        setattr(parent, child_name, layer)
    return len(swaps)
