"""The gated MLP of Llama-family decoders: down(act(gate(x)) * up(x))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from arbor.kernels.reference import silu_and_mul_ref
from arbor.runtime.model.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from arbor.runtime.model.parallel import TensorParallel


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] = gate | up -> gelu_tanh(gate) * up [..., I]."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


# config.json's hidden_act -> the op on gate | up (model_config.ACTIVATIONS lists these names)
ACTIVATIONS = {"silu": silu_and_mul_ref, "gelu_pytorch_tanh": gelu_tanh_and_mul}


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), with gate and up fused into one column-parallel matmul and
    down row-parallel. `act` is the op it runs on gate | up; kernel selection routes a SiLU to a
    fused kernel."""

    def __init__(self, hidden: int, intermediate: int, tp: TensorParallel, activation: str = "silu") -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate], False, tp)
        self.down_proj = RowParallelLinear(intermediate, hidden, tp)
        self.activation = activation
        self.act = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))
