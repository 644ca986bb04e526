"""Torch references of every Triton kernel in this package, with the same signatures.

They are the CPU path's ops and the oracle the kernels are tested against; this module
imports torch only, so the torch path never loads Triton.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SHIFTS = torch.arange(32, dtype=torch.int32)


def rmsnorm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """weight * x / rms(x) over the last dim, in float32; with `residual`, x + residual first,
    returning (normed, x + residual). Torch reference."""
    if residual is not None:
        x = x + residual
        residual = x
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * h.to(x.dtype)
    return out if residual is None else (out, residual)


def rotary_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hkv, D] rotated in place by the cos/sin tables [max_pos, D] (whose
    halves repeat) at `positions` [T]; returns (q, k). Torch reference."""
    c = cos[positions].unsqueeze(1).to(q.dtype)
    s = sin[positions].unsqueeze(1).to(q.dtype)
    for x in (q, k):
        a, b = x.chunk(2, dim=-1)
        x.copy_(x * c + torch.cat([-b, a], dim=-1) * s)
    return q, k


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2I] = gate | up -> silu(gate) * up [..., I] (torch reference)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def store_kv_ref(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """k_pool[slots[i]] = k[i] (and v), pools [slots, Hkv, D], k/v [T, Hkv, D]. Torch reference."""
    k_pool[slots] = k.to(k_pool.dtype)
    v_pool[slots] = v.to(v_pool.dtype)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits[b, t] = -inf where bit t of row b is clear (torch reference). Tokens
    past the mask's width are forbidden."""
    vocab = logits.shape[-1]
    shifts = _SHIFTS.to(bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)[:, :vocab]
    if allowed.shape[1] < vocab:
        pad = torch.zeros(allowed.shape[0], vocab - allowed.shape[1], dtype=torch.bool, device=allowed.device)
        allowed = torch.cat([allowed, pad], dim=1)
    logits.masked_fill_(~allowed, float("-inf"))


def decode_attention_ref(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """q [B, Hq, D]; pools [slots, Hkv, D]; request b reads slots
    kv_indices[kv_indptr[b]:kv_indptr[b + 1]]. Returns [B, Hq, D] (torch reference)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k_pool.shape[1]
    for b in range(q.shape[0]):
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        k = k_pool[slots].float().repeat_interleave(group, 1)  # [N, Hq, D]
        v = v_pool[slots].float().repeat_interleave(group, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[b].float(), k) * scale, -1)
        out[b] = torch.einsum("hn,nhd->hd", p, v).to(q.dtype)
    return out


def extend_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    scale: float,
    max_extend: int,
) -> torch.Tensor:
    """q [T, Hq, D], k/v [T, Hkv, D] of the new tokens (request b owns rows
    qo_indptr[b]:qo_indptr[b + 1]); its prefix is the pool slots
    kv_indices[kv_indptr[b]:kv_indptr[b + 1]]. Returns [T, Hq, D] (torch reference)."""
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    for b in range(qo_indptr.numel() - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        keys = torch.cat([k_pool[slots], k[q0:q1]]).float().repeat_interleave(group, 1)
        vals = torch.cat([v_pool[slots], v[q0:q1]]).float().repeat_interleave(group, 1)
        prefix, ext = slots.numel(), q1 - q0
        allowed = torch.arange(prefix + ext)[None, :] <= prefix + torch.arange(ext)[:, None]
        s = torch.einsum("qhd,nhd->hqn", q[q0:q1].float(), keys) * scale
        p = torch.softmax(s.masked_fill(~allowed.to(s.device), float("-inf")), -1)
        out[q0:q1] = torch.einsum("hqn,nhd->qhd", p, vals).to(q.dtype)
    return out


def woq_dequantize_ref(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, cols: int, group: int, kind: int
) -> torch.Tensor:
    """The float32 weight [out, cols] of quantized codes (kind 0 int8, 1 int4 in blocks of
    32 values: byte j holds value j in its low nibble and j + 16 in its high one, 2 float8
    e4m3), w = (code - zero) * scale per row and group of columns."""
    if kind == 1:
        blocks = codes.view(codes.shape[0], -1, 1, 16)
        values = torch.cat([blocks & 15, blocks >> 4], 2).reshape(codes.shape[0], cols).float()
    elif kind == 0:
        values = codes.view(torch.int8).float()
    else:
        values = codes.view(torch.float8_e4m3fn).float()
    return (values - zero.repeat_interleave(group, 1)) * scale.repeat_interleave(group, 1)
