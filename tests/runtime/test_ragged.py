"""The ragged index helpers match a plain-Python loop over requests."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from arbor.runtime.model.ragged import gather_rows, indptr, ragged_arange, ragged_cells

LENGTHS = st.lists(st.integers(0, 6), min_size=1, max_size=8)


def _t(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


@given(LENGTHS)
def test_indptr_is_zero_then_running_sum(lengths: list[int]) -> None:
    out = indptr(_t(lengths))
    assert out.dtype == torch.int32
    assert out.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert indptr(_t(lengths), torch.int64).dtype == torch.int64


@given(st.data())
def test_ragged_arange_concatenates_each_range(data: st.DataObject) -> None:
    lengths = data.draw(LENGTHS)
    starts = data.draw(st.lists(st.integers(0, 50), min_size=len(lengths), max_size=len(lengths)))
    out = ragged_arange(_t(starts).to(torch.int32), _t(lengths))
    assert out.dtype == torch.int64
    assert out.tolist() == [s + i for s, n in zip(starts, lengths) for i in range(n)]


@given(st.data())
def test_ragged_cells_name_each_cell_in_row_order(data: st.DataObject) -> None:
    lengths = data.draw(LENGTHS)
    n = len(lengths)
    rows = data.draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    starts = data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    got_rows, got_cols = ragged_cells(_t(rows), _t(starts), _t(lengths))
    expected = [(r, s + i) for r, s, k in zip(rows, starts, lengths) for i in range(k)]
    assert list(zip(got_rows.tolist(), got_cols.tolist())) == expected


@settings(max_examples=50)
@given(st.data())
def test_gather_rows_reads_each_rows_prefix(data: st.DataObject) -> None:
    lengths = data.draw(LENGTHS)
    rows = data.draw(st.lists(st.integers(0, 9), min_size=len(lengths), max_size=len(lengths)))
    table = torch.arange(10 * 8, dtype=torch.int32).reshape(10, 8)
    out = gather_rows(table, _t(rows), _t(lengths))
    assert out.dtype == torch.int32
    assert out.tolist() == [int(table[r, i]) for r, k in zip(rows, lengths) for i in range(k)]


def test_empty_batch_gives_empty_indices() -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    assert indptr(empty).tolist() == [0]
    assert ragged_arange(empty, empty).numel() == 0
    assert gather_rows(torch.zeros(2, 4, dtype=torch.int32), empty, empty).numel() == 0
