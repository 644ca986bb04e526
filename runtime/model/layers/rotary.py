"""Rotary position embedding (RoPE), with linear and Llama-3 frequency scaling."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from arbor.kernels.reference import rotary_ref


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE over a cos/sin table built once per device (float32, like HF); one
    instance is shared by every attention layer. `kernel` is the op it runs: the torch
    reference until kernel selection routes it to a fused kernel. No parameters."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None):
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self.kernel = rotary_ref

    def _table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._tables:
            pos = torch.arange(self.max_positions, dtype=torch.float32, device="cpu")
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat([freqs, freqs], dim=-1)
            self._tables[device] = (emb.cos().to(device), emb.sin().to(device))
        return self._tables[device]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D]; positions: [T] int. Rotates in place."""
        cos, sin = self._table(positions.device)
        return self.kernel(positions, q, k, cos, sin)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies, with linear or Llama-3 scaling applied."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if scaling is None:
        return inv
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv / factor
    # Llama 3: keep high frequencies, divide low ones by `factor`, blend in between.
    old_ctx = float(scaling["original_max_position_embeddings"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    wavelen = 2 * math.pi / inv
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > old_ctx / low, inv / factor, inv)
    is_mid = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
    return torch.where(is_mid, blended, out)
