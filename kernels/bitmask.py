"""Apply a token bitmask to logits: int32 words, bit t of word t // 32 set = token t allowed."""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits[b, t] = -inf where bit t of row b is clear (torch reference)."""
    vocab = logits.shape[-1]
    shifts = _SHIFTS.to(bitmask.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)[:, :vocab]
    if allowed.shape[1] < vocab:  # mask narrower than the logits: the rest is forbidden
        pad = torch.zeros(allowed.shape[0], vocab - allowed.shape[1], dtype=torch.bool, device=allowed.device)
        allowed = torch.cat([allowed, pad], dim=1)
    logits.masked_fill_(~allowed, float("-inf"))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place, the fastest implementation for the device (torch until the Triton kernel lands)."""
    apply_token_bitmask_ref(logits, bitmask)
