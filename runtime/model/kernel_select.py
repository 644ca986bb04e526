"""Fused ops: swap the torch references of a model's layers for kernels with the same contracts
(Triton on GPUs, Arbor's C++ kernels on CPUs)."""

from __future__ import annotations

from collections.abc import Callable

from arbor.runtime.model.causal_lm import CausalLM
from arbor.runtime.model.layers import GatedMLP, RMSNorm, RotaryEmbedding


def use_kernels(model: CausalLM, rmsnorm: Callable, silu_and_mul: Callable, rotary: Callable) -> None:
    """Route every RMSNorm (with its residual add), SiLU-and-mul and RoPE of `model` through
    the given kernels (each layer's declared `kernel` or `act`)."""
    for m in model.modules():
        if isinstance(m, RMSNorm):
            m.kernel = rmsnorm
        elif isinstance(m, GatedMLP) and m.activation == "silu":
            m.act = silu_and_mul
        elif isinstance(m, RotaryEmbedding):
            m.kernel = rotary


def use_triton_kernels(model: CausalLM) -> None:
    """The GPU path, chosen with the triton attention backend (Triton loads here only)."""
    from arbor.kernels.activation import silu_and_mul_triton
    from arbor.kernels.norm import rmsnorm_triton
    from arbor.kernels.rotary import rotary_triton

    use_kernels(model, rmsnorm_triton, silu_and_mul_triton, rotary_triton)


def use_cpu_kernels(model: CausalLM) -> bool:
    """The CPU path, when Arbor's C++ kernels build here; False (references kept) otherwise."""
    from arbor.kernels import cpu_ops

    if cpu_ops.load() is None:
        return False
    use_kernels(model, cpu_ops.rmsnorm_cpu, cpu_ops.silu_and_mul_cpu, cpu_ops.rotary_cpu)
    return True
