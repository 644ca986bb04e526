"""Swap a model's linear layers for QuantLinear where its checkpoint is quantized."""

from __future__ import annotations

from arbor.runtime.model.causal_lm import CausalLM
from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.layers import ParallelLinear
from arbor.runtime.model.quant.config import QuantConfig
from arbor.runtime.model.quant.linear import QuantLinear


def quantize_linears(model: CausalLM, qc: QuantConfig) -> int:
    """Replace each dense linear layer whose checkpoint layers are quantized (call on the
    meta-device model, before its weights load, on one rank); the number replaced."""
    swaps = []
    for name, layer in model.named_modules():
        if not isinstance(layer, ParallelLinear):
            continue
        parts = model.linear_parts(name)
        schemes = {qc.scheme_for(hf) for hf, _, _ in parts}
        if schemes == {None}:
            continue
        if len(schemes) > 1:
            raise CheckpointError(
                f"{name}: the layers fused into it ({', '.join(p[0] for p in parts)}) are "
                "quantized differently; Arbor fuses them, so they must match"
            )
        scheme = schemes.pop()
        assert scheme is not None
        swaps.append(
            (
                name,
                QuantLinear(
                    layer.in_features, layer.out_features, layer.bias is not None, scheme, layer.output_shards()
                ),
            )
        )
    for name, quantized in swaps:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, quantized)
    return len(swaps)
