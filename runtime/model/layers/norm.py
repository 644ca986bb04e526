"""RMSNorm, with the residual add that precedes it fused in."""

from __future__ import annotations

import torch
from torch import nn

from arbor.kernels.reference import rmsnorm_ref
from arbor.runtime.model.layers.weight_layer import WeightLayer


class RMSNorm(WeightLayer):
    """RMSNorm computed in float32; with `residual`, adds it first and returns both. `kernel` is
    the op it runs: the torch reference until kernel selection routes it to a fused kernel."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernel = rmsnorm_ref

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.kernel(x, self.weight, self.eps, residual)
