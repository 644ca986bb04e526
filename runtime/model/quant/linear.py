"""Linear layers over quantized weights, one kernel per kind, each with a dequantize-then-
matmul reference of the same signature (`QuantLinear.reference`).

On CPUs the kernels are torch's own packed ones:
- int4 weights (W4A16): `torch._weight_int4pack_mm_for_cpu`, weights repacked once at load;
- int8 weights (W8A16): `torch._weight_int8pack_mm` per group of columns (it takes one
  scale per row), zero points folded in through each group's row sums of x;
- W8A8: x quantized to int8 per token, `torch._int_mm`, both scales applied to the int32 sum;
- FP8: x quantized to float8 per token, `torch._scaled_mm` with row and column scales.
Where a kernel does not apply (a device or dtype it lacks), the layer keeps the dequantized
weight in the model's dtype and says so in the log: same numbers, none of the savings.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.quant.config import WeightScheme
from arbor.runtime.model.quant.formats import FloatWeight, IntWeight, concat, decode

logger = logging.getLogger(__name__)

Kernel = Callable[[torch.Tensor], torch.Tensor]
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


class QuantLinear(nn.Module):
    """A linear layer whose weight arrives quantized, possibly in parts (fused q/k/v or
    gate/up): `stage` each checkpoint tensor while loading, then `build` once."""

    def __init__(self, in_features: int, out_features: int, bias: bool, scheme: WeightScheme,
                 parts: list[tuple[int, int]]) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.parts = parts  # (first row, rows) of each checkpoint layer fused into this one
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.staged: dict[int, dict[str, torch.Tensor]] = {}
        self.weight: IntWeight | FloatWeight | None = None
        self.kernel: Kernel | None = None

    def stage(self, row: int, key: str, tensor: torch.Tensor) -> None:
        self.staged.setdefault(row, {})[key] = tensor

    def build(self, where: str, dtype: torch.dtype) -> None:
        """Decode the staged parts, fuse them, and prepare the kernel (repacking once)."""
        missing = [lo for lo, _ in self.parts if lo not in self.staged]
        if missing:
            raise CheckpointError(f"{where}: the checkpoint lacks quantized weights for rows {missing[0]}...")
        self.weight = concat([decode(self.scheme, self.staged[lo], (rows, self.in_features), f"{where}[{lo}:]")
                              for lo, rows in self.parts])
        self.staged.clear()
        self.kernel = make_kernel(self.weight, self.scheme, dtype, self.weight_device())
        if self.kernel is None:
            dense = self.weight.dequantize().to(dtype)
            self.kernel = lambda x: F.linear(x, dense)
            logger.warning("%s: no %s kernel for %s on %s; running dequantized", where, self.scheme.name,
                           str(dtype).removeprefix("torch."), self.weight_device().type)

    def weight_device(self) -> torch.device:
        return self.weight.q.device if isinstance(self.weight, IntWeight) else self.weight.w.device

    def weight_bytes(self) -> int:
        """Bytes the quantized weight takes as stored (values, scales, zero points)."""
        w = self.weight
        if isinstance(w, FloatWeight):
            return w.w.numel() + 4 * w.scale.numel()
        zero = 0 if w.zero is None else w.zero.numel() * w.bits // 8
        return w.q.numel() * w.bits // 8 + 2 * w.scale.numel() + zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.kernel(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same product through the dequantized float32 weight, in x's dtype (activations
        quantized the same way where the scheme quantizes them)."""
        if self.scheme.activations is not None:
            x = fake_quantize_tokens(x, self.scheme.activations)
        y = F.linear(x.float(), self.weight.dequantize()).to(x.dtype)
        return y if self.bias is None else y + self.bias


def quantize_tokens(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric quantization of activations [M, K]: values (int8 or float8) and the
    float32 scale [M, 1] each row is multiplied back by."""
    absmax = x.abs().amax(-1, keepdim=True).float().clamp_(min=1e-8)
    if kind == "int8":
        scale = absmax / 127.0
        return torch.round(x.float() / scale).clamp_(-127, 127).to(torch.int8), scale
    scale = absmax / FP8_MAX
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def fake_quantize_tokens(x: torch.Tensor, kind: str) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    values, scale = quantize_tokens(flat, kind)
    return (values.float() * scale).to(x.dtype).reshape(x.shape)


def make_kernel(w: IntWeight | FloatWeight, scheme: WeightScheme, dtype: torch.dtype, device: torch.device
                ) -> Kernel | None:
    """The fastest kernel for this weight here, or None (run dequantized)."""
    if device.type != "cpu":
        return None
    if isinstance(w, FloatWeight):
        return _fp8_kernel(w, dtype) if scheme.activations == "fp8" else None
    if scheme.activations == "int8":
        return _w8a8_kernel(w)
    if w.bits == 4:
        return _int4_kernel(w, dtype)
    return _int8_kernel(w, dtype)


def _int4_kernel(w: IntWeight, dtype: torch.dtype) -> Kernel | None:
    """tinygemm's CPU int4 layout: unsigned nibbles, dequantized as (u - 8) * scale + bias."""
    if w.q.shape[1] % w.group or w.group not in (32, 64, 128, 256) or w.q.shape[0] % 16:
        return None
    packed = torch._convert_weight_to_int4pack_for_cpu((w.q.to(torch.int32) + 8), 1)
    zero = torch.zeros_like(w.scale) if w.zero is None else w.zero.float()
    scale_bias = torch.stack([w.scale, -zero * w.scale], -1).transpose(0, 1).contiguous().to(dtype)
    group = w.group
    return lambda x: torch._weight_int4pack_mm_for_cpu(x.contiguous(), packed, group, scale_bias)


def _int8_kernel(w: IntWeight, dtype: torch.dtype) -> Kernel:
    """Per group of columns: int8 rows times x, one scale per row; zero points subtract the
    group's row sums of x times zero * scale."""
    cols = w.q.shape[1]
    bounds = [(lo, min(lo + w.group, cols)) for lo in range(0, cols, w.group)]
    qs = [w.q[:, lo:hi].contiguous() for lo, hi in bounds]
    scales = [w.scale[:, g].to(dtype).contiguous() for g in range(len(bounds))]
    offsets = None if w.zero is None else (w.zero.float() * w.scale).T.to(dtype).contiguous()  # [groups, out]

    def run(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if len(bounds) == 1:
            y = torch._weight_int8pack_mm(x, qs[0], scales[0])
        else:
            y = sum(torch._weight_int8pack_mm(x[:, lo:hi].contiguous(), q, s)
                    for (lo, hi), q, s in zip(bounds, qs, scales))
        if offsets is not None:
            sums = torch.stack([x[:, lo:hi].sum(-1) for lo, hi in bounds], -1)  # [M, groups]
            y = y - sums @ offsets
        return y

    return run


def _w8a8_kernel(w: IntWeight) -> Kernel:
    q_t = w.q.T.contiguous()  # [in, out]
    w_scale = w.scale.reshape(1, -1)

    def run(x: torch.Tensor) -> torch.Tensor:
        values, scale = quantize_tokens(x, "int8")
        return (torch._int_mm(values, q_t).float() * scale * w_scale).to(x.dtype)

    return run


def _fp8_kernel(w: FloatWeight, dtype: torch.dtype) -> Kernel:
    w_t = w.w.T  # column-major [in, out], as _scaled_mm wants its second operand
    w_scale = w.scale.reshape(1, -1).contiguous()

    def run(x: torch.Tensor) -> torch.Tensor:
        values, scale = quantize_tokens(x, "fp8")
        return torch._scaled_mm(values, w_t, scale_a=scale, scale_b=w_scale, out_dtype=x.dtype)

    return run
