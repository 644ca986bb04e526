"""Apply a token bitmask to logits: int32 words, bit t of word t // 32 set = token t allowed."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bitmask_kernel(Logits, Mask, stride_l, stride_m, VOCAB: tl.constexpr, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < VOCAB
    words = tl.load(Mask + row * stride_m + cols // 32, mask=ok & (cols // 32 < WORDS), other=0)
    allowed = ((words >> (cols % 32)) & 1) != 0
    logits = tl.load(Logits + row * stride_l + cols, mask=ok)
    tl.store(Logits + row * stride_l + cols, tl.where(allowed, logits, float("-inf")), mask=ok)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Same contract as reference.apply_token_bitmask_ref; one pass over the logits."""
    rows, vocab = logits.shape
    if rows:
        block = 1024
        _bitmask_kernel[(rows, triton.cdiv(vocab, block))](
            logits,
            bitmask,
            logits.stride(0),
            bitmask.stride(0),
            VOCAB=vocab,
            WORDS=bitmask.shape[1],
            BLOCK=block,
        )
