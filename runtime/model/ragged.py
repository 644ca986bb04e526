"""Ragged index arithmetic: per-request lengths turned into flat (CSR) index tensors.

A batch holds requests of different lengths back to back; these helpers turn `[B]` lengths
into the flat `[sum(lengths)]` indices the kernels and tables read, in a fixed handful of
tensor ops (no loop over requests), on the inputs' device.
"""

from __future__ import annotations

import torch


def indptr(lengths: torch.Tensor, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """[B + 1] CSR offsets: 0, then the running sum of `lengths`."""
    out = torch.zeros(lengths.numel() + 1, dtype=dtype, device=lengths.device)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def ragged_arange(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """starts[i] + arange(lengths[i]) for each i, concatenated: [sum(lengths)] int64."""
    total = int(lengths.sum())
    base = starts.to(torch.int64) - (torch.cumsum(lengths, 0) - lengths)
    return torch.arange(total, device=lengths.device) + base.repeat_interleave(lengths, output_size=total)


def ragged_cells(rows: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) of every cell table[rows[i], starts[i] : starts[i] + lengths[i]], in order."""
    cols = ragged_arange(starts, lengths)
    return rows.repeat_interleave(lengths, output_size=cols.numel()), cols


def gather_rows(table: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """table[rows[i], :lengths[i]] for each i, concatenated: [sum(lengths)] in the table's dtype."""
    width = int(lengths.max()) if lengths.numel() else 0
    prefixes = table[rows, :width]
    return prefixes[torch.arange(width, device=table.device)[None, :] < lengths[:, None]]
