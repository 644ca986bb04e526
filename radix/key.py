"""Token keys: token ids packed as int32 bytes, so slicing and comparing run at memcpy speed."""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TypeAlias

TOKEN_BYTES = 4
# A string: `array` takes a type argument at run time only from Python 3.12.
TokenIds: TypeAlias = "bytes | array[int] | Sequence[int]"


def to_key(tokens: TokenIds) -> bytes:
    """Pack token ids into a key; an `array('i')` or `bytes` input costs one memcpy."""
    if isinstance(tokens, bytes):
        return tokens
    if isinstance(tokens, array):
        if tokens.typecode != "i":
            raise TypeError(f"token array must have typecode 'i', got {tokens.typecode!r}")
        return tokens.tobytes()
    return array("i", tokens).tobytes()


def to_values(indices: array[int] | Sequence[int]) -> array[int]:
    """KV slot indices as a compact int32 array (no copy when already one)."""
    if isinstance(indices, array) and indices.typecode == "i":
        return indices
    return array("i", indices)


def common_prefix_bytes(key: bytes, offset: int, edge: bytes) -> int:
    """Number of leading bytes of `edge` that equal `key[offset:]`.

    Bisects with slice comparisons (memcmp) over a shrinking window, so the work is
    O(len) bytes and O(log len) Python steps instead of a per-token loop.
    """
    n = min(len(key) - offset, len(edge))
    if key[offset : offset + n] == edge[:n]:
        return n
    lo, hi = 0, n  # key[offset:offset+lo] == edge[:lo]; a mismatch lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[offset + lo : offset + mid] == edge[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
