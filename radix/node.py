"""A node of the radix tree: one edge of token key bytes and the KV slots behind it."""

from __future__ import annotations

import itertools
from array import array

_uids = itertools.count(1)


class TreeNode:
    """Edge `key` (int32 token bytes) with one KV slot per token in `value`.

    `edge` is the child-dict key under `parent` (the first page of `key`); `lock_ref`
    counts the running requests whose matched path passes through this node.
    """

    __slots__ = ("children", "edge", "key", "last_access", "lock_ref", "parent", "uid", "value")

    def __init__(self, parent: TreeNode | None, edge: bytes, key: bytes, value: array[int], now: int) -> None:
        self.children: dict[bytes, TreeNode] = {}
        self.parent = parent
        self.edge = edge
        self.key = key
        self.value = value
        self.lock_ref = 0
        self.last_access = now
        self.uid = next(_uids)

    @property
    def num_tokens(self) -> int:
        """Tokens (and KV slots) on this edge."""
        return len(self.value)

    def __repr__(self) -> str:
        return f"TreeNode(uid={self.uid}, tokens={len(self.value)}, lock_ref={self.lock_ref})"
