"""Checkpoint tensors of one linear layer, decoded into one form per kind.

compressed-tensors stores, per linear layer (`<name>.<tensor>`):
- pack-quantized: `weight_packed` int32 [out, ceil(in * bits / 32)], values offset by
  2^(bits-1) to unsigned and packed densely from bit 0 of each word; `weight_scale`
  [out, groups]; `weight_zero_point` (asymmetric) packed the same way but along dim 0;
  `weight_shape` [2].
- int-quantized / naive-quantized: `weight` int8 [out, in], `weight_scale` [out, 1].
- float-quantized: `weight` float8_e4m3fn [out, in], `weight_scale` [out, 1] or [1].
AutoAWQ's GEMM layout: `qweight` int32 [in, out / 8] and `qzeros` int32 [groups, out / 8],
eight 4-bit values a word along the output dimension in the order 0, 2, 4, 6, 1, 3, 5, 7;
`scales` float16 [groups, out]; w = (q - zero) * scale, all unsigned.
GPTQ's layout: `qweight` int32 [in * bits / 32, out], values packed along the input dimension
from bit 0 of each word; `qzeros` int32 [groups, out * bits / 32], packed along the output
dimension (format v1 stores zero - 1); `scales` float16 [groups, out]; `g_idx` int32 [in], the
group of each input column. With act-order the groups are not contiguous: the columns are
sorted by group, and the layer permutes x the same way (`IntWeight.perm`).
Each decodes to `IntWeight` (w = (q - zero) * scale per group of columns) or `FloatWeight`
(w = fp8 * scale per row). Parts of a fused layer (q/k/v, gate/up) concatenate by rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.quant.config import AWQ_GEMM, GPTQ_V1, GPTQ_V2, WeightScheme


@dataclass
class IntWeight:
    """Signed integer weights with a scale (and zero point) per row and group of columns."""

    q: torch.Tensor  # [out, in] int8, within the signed range of `bits`
    scale: torch.Tensor  # [out, groups] float32
    zero: torch.Tensor | None  # [out, groups] integer; None: symmetric (zero 0)
    group: int  # columns per group (in_features when per channel)
    bits: int
    perm: torch.Tensor | None = None  # act-order: the input column each column of q multiplies


@dataclass
class FloatWeight:
    """float8_e4m3 weights with a float32 scale per row."""

    w: torch.Tensor  # [out, in] float8_e4m3fn
    scale: torch.Tensor  # [out] float32


def _fields(words: torch.Tensor, bits: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, words * 32 / bits] int16: unsigned `bits`-bit fields from bit 0 up."""
    shifts = torch.arange(32 // bits, dtype=torch.int32, device=words.device) * bits
    fields = (words.to(torch.int32)[:, :, None] >> shifts) & ((1 << bits) - 1)
    return fields.reshape(words.shape[0], -1).to(torch.int16)


def unpack_int32(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """[rows, words] int32 -> [rows, count] int8: `bits`-bit fields from bit 0 up, minus the
    2^(bits-1) offset they were stored with."""
    return (_fields(words, bits)[:, :count] - (1 << (bits - 1))).to(torch.int8)


AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output column each of a word's 8 nibbles holds


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """[rows, cols / 8] int32 in AWQ's order -> [rows, cols] int8 values 0..15."""
    shifts = torch.arange(8, dtype=torch.int32, device=words.device) * 4
    nibbles = (words.to(torch.int32)[:, :, None] >> shifts) & 15  # nibble i holds column AWQ_ORDER[i]
    columns = torch.empty_like(nibbles)
    columns[:, :, list(AWQ_ORDER)] = nibbles
    return columns.reshape(words.shape[0], -1).to(torch.int8)


def _decode_awq(tensors: dict[str, torch.Tensor], shape: tuple[int, int], group: int, where: str) -> IntWeight:
    out, cols = shape
    for key in ("qweight", "scales"):
        if key not in tensors:
            raise CheckpointError(f"{where}: missing {key} for an AWQ layer")
    q = unpack_awq(tensors["qweight"]).T.contiguous()  # [out, in], 0..15
    scale = tensors["scales"].float().T.contiguous()  # [out, groups]
    if tuple(q.shape) != shape or cols % group or tuple(scale.shape) != (out, cols // group):
        raise CheckpointError(
            f"{where}: AWQ weight {tuple(q.shape)} with scales {tuple(scale.shape)} does not fit "
            f"{shape} in groups of {group}"
        )
    zero = unpack_awq(tensors["qzeros"]).T.contiguous() - 8 if "qzeros" in tensors else None
    return IntWeight((q - 8).contiguous(), scale, zero, group, 4)  # signed, as the other formats


def _decode_gptq(
    tensors: dict[str, torch.Tensor], shape: tuple[int, int], scheme: WeightScheme, where: str
) -> IntWeight:
    out, cols = shape
    for key in ("qweight", "qzeros", "scales"):
        if key not in tensors:
            raise CheckpointError(f"{where}: missing {key} for a GPTQ layer")
    bits, half = scheme.bits, 1 << (scheme.bits - 1)
    q = _fields(tensors["qweight"].T.contiguous(), bits)  # [out, in], unsigned
    scale = tensors["scales"].float().T.contiguous()  # [out, groups]
    zero = _fields(tensors["qzeros"], bits)[:, :out].T.contiguous() + (scheme.format == GPTQ_V1)
    groups = scale.shape[1]
    if tuple(q.shape) != shape or groups == 0 or cols % groups or tuple(zero.shape) != (out, groups):
        raise CheckpointError(
            f"{where}: GPTQ weight {tuple(q.shape)} with scales {tuple(scale.shape)} and zeros "
            f"{tuple(zero.shape)} does not fit {shape}"
        )
    group = cols // groups
    perm, g_idx = None, tensors.get("g_idx")
    in_order = torch.arange(cols, device=q.device) // group  # each column's group without act-order
    if g_idx is not None and not torch.equal(g_idx.long(), in_order):
        perm = torch.argsort(g_idx.long(), stable=True)
        if not torch.equal(g_idx.long()[perm], in_order):
            raise CheckpointError(f"{where}: g_idx does not give every group {group} columns")
        q = q[:, perm]
    return IntWeight((q - half).to(torch.int8).contiguous(), scale, zero - half, group, bits, perm)


def decode(
    scheme: WeightScheme, tensors: dict[str, torch.Tensor], shape: tuple[int, int], where: str
) -> IntWeight | FloatWeight:
    """One linear layer's tensors (keyed by suffix: "weight_packed", ...) in their decoded form."""
    out, cols = shape

    def need(key: str) -> torch.Tensor:
        if key not in tensors:
            raise CheckpointError(f"{where}: missing {key} for a {scheme.format} {scheme.name} layer")
        return tensors[key]

    if scheme.format == AWQ_GEMM:
        if scheme.group_size is None:
            raise CheckpointError(f"{where}: AWQ weights come in groups; the config gives no group_size")
        return _decode_awq(tensors, shape, scheme.group_size, where)
    if scheme.format in (GPTQ_V1, GPTQ_V2):
        return _decode_gptq(tensors, shape, scheme, where)
    scale = need("weight_scale").float()
    if scheme.kind == "float":
        w = need("weight")
        if w.dtype != torch.float8_e4m3fn or tuple(w.shape) != shape:
            raise CheckpointError(f"{where}: weight {w.dtype} {tuple(w.shape)}, expected float8_e4m3fn {shape}")
        return FloatWeight(w, scale.reshape(-1).expand(out).contiguous())
    if scheme.format == "pack-quantized":
        stored = tuple(int(x) for x in need("weight_shape").tolist())
        if stored != shape:
            raise CheckpointError(f"{where}: weight_shape {stored}, expected {shape}")
        q = unpack_int32(need("weight_packed"), scheme.bits, cols)
        zero = None
        if not scheme.symmetric:
            zero = unpack_int32(need("weight_zero_point").T.contiguous(), scheme.bits, out).T.contiguous()
    else:
        q = need("weight")
        if q.dtype != torch.int8:
            raise CheckpointError(f"{where}: weight {q.dtype}, expected int8")
        zero = None if scheme.symmetric else need("weight_zero_point").to(torch.int8)
    group = scheme.group_size or cols
    if tuple(q.shape) != shape or cols % group or tuple(scale.shape) != (out, cols // group):
        raise CheckpointError(
            f"{where}: weight {tuple(q.shape)} with scales {tuple(scale.shape)} does not fit "
            f"{shape} in groups of {group}"
        )
    if zero is not None:
        zero = zero.reshape(scale.shape)
    return IntWeight(q.contiguous(), scale.contiguous(), zero, group, scheme.bits)


def _same_order(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two act-order permutations are the same (None: no act-order)."""
    if a is None or b is None:
        return a is b
    return torch.equal(a, b)


def concat(parts: list[IntWeight | FloatWeight]) -> IntWeight | FloatWeight:
    """Row-wise concatenation of a fused layer's parts (same scheme each)."""
    if len(parts) == 1:
        return parts[0]
    floats = [p for p in parts if isinstance(p, FloatWeight)]
    if floats:
        return FloatWeight(torch.cat([p.w for p in floats]), torch.cat([p.scale for p in floats]))
    ints = [p for p in parts if isinstance(p, IntWeight)]
    zeros = [p.zero for p in ints if p.zero is not None]
    zero = torch.cat(zeros) if zeros else None
    first = ints[0]
    if not all(_same_order(p.perm, first.perm) for p in ints):
        raise CheckpointError(
            "the act-order layers fused into one (q/k/v or gate/up) order their columns "
            "differently; Arbor fuses them, so their g_idx must match"
        )
    return IntWeight(
        torch.cat([p.q for p in ints]), torch.cat([p.scale for p in ints]), zero, first.group, first.bits, first.perm
    )
