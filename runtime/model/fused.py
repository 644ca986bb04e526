"""The GPU path's fused ops: swap the torch references of a model for the Triton kernels."""

from __future__ import annotations

from torch import nn

from arbor.kernels.activation import silu_and_mul_triton
from arbor.kernels.norm import rmsnorm_triton
from arbor.kernels.rotary import rotary_triton
from arbor.runtime.model.layers import GatedMLP, RMSNorm, RotaryEmbedding


def use_fused_kernels(model: nn.Module) -> None:
    """Route every RMSNorm (with its residual add), SiLU-and-mul and RoPE of `model` through
    the Triton kernels: the GPU path, chosen with the triton attention backend."""
    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.kernel = rmsnorm_triton
        elif isinstance(m, GatedMLP):
            m.act = silu_and_mul_triton
        rotary = getattr(m, "rotary", None)
        if isinstance(rotary, RotaryEmbedding):
            rotary.kernel = rotary_triton


