"""KV-cache memory: the per-layer K/V pool, the page allocator, and the request-to-slot table.

Slot 0 (page 0 when pages are larger) is a reserved dummy: padded entries point at it, so a
kernel can read any table entry without a bounds check.
"""

from __future__ import annotations

import torch

from arbor.kernels.cpu_ops import store_kv_cpu
from arbor.kernels.reference import store_kv_ref
from arbor.runtime.model.ragged import ragged_cells


class KVPool:
    """Per layer, K and V buffers of shape [num_slots, num_kv_heads, head_dim]."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_slots, num_kv_heads, head_dim)
        self.num_slots = num_slots
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._store = store_kv_cpu if torch.device(device).type == "cpu" else store_kv_ref

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write new tokens' k/v [T, Hkv, D] into `slots` [T] of `layer`."""
        self._store(self.k[layer], self.v[layer], slots, to_kv_dtype(k, self.dtype), to_kv_dtype(v, self.dtype))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def as_stored(k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """New tokens' k/v as attention sees them: rounded through a float8 pool's dtype (so every
    path, the pool's reads and the new tokens' own, attends to the same values)."""
    if dtype != torch.float8_e4m3fn:
        return k, v
    return to_kv_dtype(k, dtype).to(k.dtype), to_kv_dtype(v, dtype).to(v.dtype)


def to_kv_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x in the pool's dtype; float8 saturates at its largest finite value (a plain cast
    would give NaN beyond it)."""
    if dtype == torch.float8_e4m3fn and x.dtype != dtype:
        limit = torch.finfo(dtype).max
        return x.clamp(-limit, limit).to(dtype)
    return x


class PageAllocator:
    """Free list of pages of `page_size` slots; page p holds slots [p*size, (p+1)*size)."""

    def __init__(self, num_slots: int, page_size: int) -> None:
        if num_slots < 2 * page_size:
            raise ValueError(f"KV pool of {num_slots} slots is too small for page_size {page_size}")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self.reset()

    def reset(self) -> None:
        """Mark every page but the reserved page 0 free."""
        self._free = list(range(self.num_pages - 1, 0, -1))  # pop() hands out low pages first

    @property
    def total_slots(self) -> int:
        """Usable slots (page 0 excluded)."""
        return (self.num_pages - 1) * self.page_size

    def available(self) -> int:
        """Free slots."""
        return len(self._free) * self.page_size

    def alloc(self, num_pages: int) -> list[int] | None:
        """Take `num_pages` pages, or None (taking nothing) if fewer are free."""
        if num_pages > len(self._free):
            return None
        taken = self._free[len(self._free) - num_pages :]
        del self._free[len(self._free) - num_pages :]
        return taken[::-1]  # in pop order: a fresh pool hands out ascending, consecutive pages

    def free_slots(self, slots: torch.Tensor) -> None:
        """Return the pages that `slots` (whole pages of slot indices) occupy; the next
        allocation gets them back in the same order, so freed runs stay consecutive."""
        pages = slots[slots % self.page_size == 0] // self.page_size
        self._free.extend(reversed(pages.tolist()))


class ReqToTokenPool:
    """[max_requests, max_context_len] int32 table: the KV slot of each request position.
    Slots are handed out in whole pages of `page_size`, so a page's positions are consecutive."""

    def __init__(self, max_requests: int, max_context_len: int, device: torch.device, page_size: int = 1) -> None:
        self.table = torch.zeros((max_requests, max_context_len), dtype=torch.int32, device=device)
        self.max_context_len = max_context_len
        self.page_size = page_size
        self._free = list(range(max_requests - 1, -1, -1))

    def available(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        """A free row, or None."""
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        self.table[row].zero_()
        self._free.append(row)


def reserve_positions(
    req_to_token: ReqToTokenPool,
    allocator: PageAllocator,
    rows: list[int],
    starts: list[int],
    ends: list[int],
) -> torch.Tensor | None:
    """Give positions [start, end) of each row a KV slot, allocating pages as needed.

    Positions in a row's last, partly used page already have slots; a new page maps all of
    its positions at once. Returns the slots of the new positions, in row order, or None if
    the pool has too few free pages (nothing is taken then).
    """
    ps = allocator.page_size
    if all(e - s == 1 for s, e in zip(starts, ends)):
        return _reserve_one_each(req_to_token, allocator, rows, starts)
    first_new = [-(-s // ps) for s in starts]  # ceil: pages below this are mapped
    counts = [-(-e // ps) - f for e, f in zip(ends, first_new)]
    pages = allocator.alloc(sum(counts))
    if pages is None:
        return None
    table = req_to_token.table
    dev = table.device
    if pages:
        page_rows = [r for r, c in zip(rows, counts) for _ in range(c)]
        page_idx = [f + i for f, c in zip(first_new, counts) for i in range(c)]
        offsets = torch.arange(ps, device=dev)
        cols = torch.tensor(page_idx, device=dev)[:, None] * ps + offsets
        slots = torch.tensor(pages, device=dev)[:, None] * ps + offsets
        table[torch.tensor(page_rows, device=dev)[:, None], cols] = slots.to(table.dtype)
    lens = torch.tensor([e - s for s, e in zip(starts, ends)], device=dev)
    cells = ragged_cells(torch.tensor(rows, device=dev), torch.tensor(starts, device=dev), lens)
    return table[cells].to(torch.int64)


def _reserve_one_each(
    req_to_token: ReqToTokenPool, allocator: PageAllocator, rows: list[int], starts: list[int]
) -> torch.Tensor | None:
    """`reserve_positions` for a decode step (one new position per row), in few tensor ops."""
    ps = allocator.page_size
    fresh = [i for i, s in enumerate(starts) if s % ps == 0]  # rows whose new position opens a page
    pages = allocator.alloc(len(fresh))
    if pages is None:
        return None
    table = req_to_token.table
    dev = table.device
    rows_t = torch.tensor(rows, device=dev)
    starts_t = torch.tensor(starts, device=dev)
    if pages:
        pages_t = torch.tensor(pages, device=dev, dtype=table.dtype)
        if ps == 1:
            table[rows_t, starts_t] = pages_t
        else:
            idx = torch.tensor(fresh, device=dev)
            offsets = torch.arange(ps, device=dev)
            table[rows_t[idx, None], starts_t[idx, None] + offsets] = pages_t[:, None] * ps + offsets.to(table.dtype)
    return table[rows_t, starts_t].to(torch.int64)
