"""Helpers for kernel tests: paged KV pools with shuffled pages, like the runtime's."""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 2e-3)}  # (rtol, atol) vs the torch reference


def paged_slots(lengths: list[int], page_size: int, seed: int) -> tuple[list[torch.Tensor], int]:
    """Slots for each request's positions, on pages handed out in a shuffled order (page 0
    reserved), and the pool size."""
    pages = [-(-n // page_size) for n in lengths]
    order = torch.randperm(sum(pages), generator=torch.Generator().manual_seed(seed)) + 1
    out, at = [], 0
    for n, k in zip(lengths, pages):
        mine = order[at : at + k]
        at += k
        slots = (mine[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)[:n]
        out.append(slots)
    return out, (sum(pages) + 1) * page_size


def csr(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr int32, indices int32) of a list of 1-D index tensors."""
    indptr = torch.zeros(len(rows) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor([r.numel() for r in rows]), 0)
    indices = torch.cat(rows).to(torch.int32) if rows else torch.zeros(0, dtype=torch.int32)
    return indptr.to(DEVICE), indices.to(DEVICE)


def assert_close(ours: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(ours.float(), ref.float(), rtol=rtol, atol=atol)
    assert ref.float().abs().max() > 10 * atol  # not a comparison of near-zero outputs
