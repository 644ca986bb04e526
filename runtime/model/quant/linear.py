"""Linear layers over quantized weights, each with a dequantize-then-matmul reference of
the same signature (`QuantLinear.reference`).

Weights are kept as codes: int8, int4 (two to a byte) or float8_e4m3 bits, with a float32
scale and zero point per row and group of columns, w = (code - zero) * scale
(`QuantWeight`). On CPUs:
- weight-only schemes (W8A16, W4A16, FP8 weight-only): decode-sized batches go to Arbor's
  `woq_linear` kernel (kernels/cpu_quant.cpp), which reads each weight once per 8 rows of x
  at 1 or 0.5 bytes a value; larger batches dequantize the weight (`woq_dequantize`) and run
  a dense GEMM, except on a weight too large to dequantize every call (a quantized LM head),
  which stays on the kernel up to 32 rows;
- W8A8 (int8 activations per token): x is quantized per row and multiplied by `torch._int_mm`,
  the int32 sums scaled back by both scales;
- FP8 with dynamic float8 activations: x is rounded to float8 per row, then as weight-only.
Without Arbor's CPU kernels the dense path serves every batch. On CUDA every scheme runs the
Triton GEMM `kernels/woq_matmul.py` (W8A8 on x rounded to int8 per row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from arbor.kernels import cpu_ops
from arbor.kernels.reference import woq_dequantize_ref
from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.layers.linear import LinearLayer
from arbor.runtime.model.layers.weight_layer import ShardId, copy_checked
from arbor.runtime.model.quant.config import WeightScheme
from arbor.runtime.model.quant.formats import FloatWeight, IntWeight, concat, decode

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
INT8, INT4, FP8 = 0, 1, 2  # code kinds, as cpu_quant.cpp numbers them
SMALL_BATCH = 8  # rows of x up to which woq_linear beats dequantize + dense GEMM (measured)
# A weight this large (values; a quantized LM head) costs more to dequantize every call than to
# read its codes once per 8 rows of x, up to LARGE_WEIGHT_BATCH rows (measured: the 50,257 x 384
# head at 16 rows, int8 8 against 31 ms, int4 14 against 32 ms)
LARGE_WEIGHT, LARGE_WEIGHT_BATCH = 1 << 23, 32


@dataclass
class QuantWeight:
    """A weight [out, cols] as codes with a scale and zero point per row and group."""

    codes: torch.Tensor  # uint8 [out, cols] (int8, fp8 bits) or [out, cols / 2] (int4, see cpu_quant.cpp)
    scale: torch.Tensor  # float32 [out, groups]
    zero: torch.Tensor  # float32 [out, groups], in code units (int4 codes are unsigned: 8 + zero point)
    cols: int
    group: int
    kind: int
    perm: torch.Tensor | None = None  # act-order: the input column each column of codes multiplies

    @classmethod
    def of(cls, w: IntWeight | FloatWeight) -> QuantWeight:
        if isinstance(w, FloatWeight):
            out, cols = w.w.shape
            return cls(w.w.view(torch.uint8), w.scale[:, None].contiguous(), torch.zeros(out, 1), cols, cols, FP8)
        zero = torch.zeros_like(w.scale) if w.zero is None else w.zero.float()
        if w.bits == 8:
            return cls(w.q.view(torch.uint8), w.scale, zero, w.q.shape[1], w.group, INT8, w.perm)
        out, cols = w.q.shape
        if cols % 32:
            raise CheckpointError(f"int4 weights need rows of a multiple of 32 values, not {cols}")
        u = (w.q + 8).to(torch.uint8).view(out, cols // 32, 2, 16)  # blocks of 32: codes j and j + 16 share a byte
        return cls(
            (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(out, cols // 2), w.scale, zero + 8, cols, w.group, INT4, w.perm
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero))

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, cols] in the checkpoint's column order, in torch ops."""
        w = woq_dequantize_ref(self.codes, self.scale, self.zero, self.cols, self.group, self.kind)
        if self.perm is None:
            return w
        return torch.empty_like(w).index_copy_(1, self.perm, w)


class QuantLinear(LinearLayer):
    """A linear layer whose weight arrives quantized, possibly in parts (fused q/k/v or
    gate/up): `weight_loader` stages each checkpoint tensor (its bias loads at once), and
    `finish_loading` decodes the parts into one weight. One rank only (no tensor parallelism)."""

    weight: QuantWeight  # the parts fused, once `finish_loading` has decoded them

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        scheme: WeightScheme,
        parts: list[tuple[ShardId, int, int]],
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.scheme = in_features, out_features, scheme
        self.parts = parts  # (shard id, first row, rows) of each checkpoint layer fused into this one
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.staged: dict[ShardId, dict[str, torch.Tensor]] = {}
        self.ops: Any = None  # Arbor's CPU kernels (cpu_ops.load()) where the weight is on a CPU
        self.kernel_rows = SMALL_BATCH  # rows of x up to which woq_linear serves (set by `finish_loading`)
        self.direct = False  # woq_linear takes x as it comes: no activation rounding, no act-order

    def output_shards(self) -> list[tuple[ShardId, int, int]]:
        return self.parts

    def weight_loader(self, param: str, tensor: torch.Tensor, shard_id: ShardId = None) -> None:
        """Stage a quantized tensor of part `shard_id` (codes, scales, zero points...); copy a bias."""
        part = next((p for p in self.parts if p[0] == shard_id), None)
        if part is None:
            raise CheckpointError(f"QuantLinear fuses no part {shard_id!r}")
        if param != "bias":
            self.staged.setdefault(shard_id, {})[param] = tensor
        elif self.bias is not None:
            _, lo, rows = part
            copy_checked(self.bias.data[lo : lo + rows], tensor)
        elif tensor.any():  # GPTQ writers give every quantized layer a bias, zero where the model has none
            raise CheckpointError("has no place in QuantLinear (a nonzero bias for a layer without one)")

    def expected_weights(self) -> set[tuple[str, ShardId]]:
        return {("bias", shard_id) for shard_id, _, _ in self.parts} if self.bias is not None else set()

    def finish_loading(self, where: str) -> None:
        """Decode the staged parts and fuse them into one QuantWeight."""
        missing = [lo for shard_id, lo, _ in self.parts if shard_id not in self.staged]
        if missing:
            raise CheckpointError(f"{where}: the checkpoint lacks quantized weights for rows {missing[0]}...")
        self.weight = QuantWeight.of(
            concat(
                [
                    decode(self.scheme, self.staged[shard_id], (rows, self.in_features), f"{where}[{lo}:]")
                    for shard_id, lo, rows in self.parts
                ]
            )
        )
        self.staged.clear()
        self.ops = cpu_ops.load() if self.weight.codes.device.type == "cpu" else None
        if self.weight.codes.shape[0] * self.weight.cols >= LARGE_WEIGHT:
            self.kernel_rows = LARGE_WEIGHT_BATCH
        self.direct = self.ops is not None and self.scheme.activations is None and self.weight.perm is None

    def weight_bytes(self) -> int:
        return self.weight.nbytes()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        act = self.scheme.activations
        if self.direct and flat.shape[0] <= self.kernel_rows:  # decode: straight to the kernel
            w = self.weight
            y = self.ops.woq_linear(flat, w.codes, w.scale, w.zero, w.group, w.kind)
        elif act == "int8" and flat.device.type == "cpu":
            y = self._int8_activations(flat)
        else:
            if act is not None:  # elsewhere: x rounded per token, then the weight-only GEMM
                flat = fake_quantize_tokens(flat, act)
            y = self._weight_only(flat.contiguous())
        if x.dim() != 2:
            y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def _weight_only(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.perm is not None:  # act-order: the codes' columns are sorted by group
            x = x.index_select(1, w.perm)
        if x.device.type == "cuda":
            # Triton loads on the GPU path only
            from arbor.kernels.woq_matmul import woq_matmul_triton

            return woq_matmul_triton(x, w.codes, w.scale, w.zero, w.group, w.kind)
        if self.ops is not None and x.shape[0] <= self.kernel_rows:
            return self.ops.woq_linear(x, w.codes, w.scale, w.zero, w.group, w.kind)
        if self.ops is not None:
            return F.linear(x, self.ops.woq_dequantize(w.codes, w.scale, w.zero, w.cols, w.group, w.kind, x.dtype))
        return F.linear(x, woq_dequantize_ref(w.codes, w.scale, w.zero, w.cols, w.group, w.kind).to(x.dtype))

    def _int8_activations(self, x: torch.Tensor) -> torch.Tensor:
        """W8A8: int8 x per row times int8 weights per channel (symmetric, one group)."""
        values, scale = quantize_tokens(x, "int8")
        w = self.weight
        return (torch._int_mm(values, w.codes.view(torch.int8).T).float() * scale * w.scale.T).to(x.dtype)

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
    """x rounded through per-row int8 or float8 and back, in x's dtype."""
    flat = x.reshape(-1, x.shape[-1])
    values, scale = quantize_tokens(flat, kind)
    return (values.float() * scale).to(x.dtype).reshape(x.shape)
