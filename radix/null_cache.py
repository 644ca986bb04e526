"""NullPrefixCache: the prefix cache of `--disable-radix-cache`, which caches nothing."""

from __future__ import annotations

from array import array

from arbor.radix.key import TOKEN_BYTES, TokenIds
from arbor.radix.node import TreeNode
from arbor.radix.prefix_cache import CacheStats, FreeFn, MatchResult, PrefixCache


class NullPrefixCache(PrefixCache):
    """Every lookup misses and every insert is declined, so each request keeps (and frees)
    all of its own slots; the sizes stay 0 and there is never anything to evict."""

    def __init__(self) -> None:
        self._root = TreeNode(None, b"", b"", array("i"), 0)  # the lock handle of every miss
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        """Never: nothing is cached."""
        return False

    def reset(self) -> None:
        """Only the stats: there is nothing cached to forget."""
        self.stats = CacheStats()

    def match_prefix(self, key: TokenIds, cache_salt: str | None = None) -> MatchResult:
        """An empty match (counted as a query that hit nothing)."""
        self.stats.queries += 1
        self.stats.query_tokens += len(key) // TOKEN_BYTES if isinstance(key, bytes) else len(key)
        return MatchResult(array("i"), self._root, 0)

    def insert(self, key: TokenIds, indices: array[int] | TokenIds, cache_salt: str | None = None) -> int:
        """Nothing was cached before, and nothing is kept now."""
        return 0

    def cacheable_len(self, num_tokens: int) -> int:
        """None of it: the caller frees every slot it offered."""
        return 0

    def lock(self, node: TreeNode) -> None:
        """Nothing to protect."""

    def unlock(self, node: TreeNode) -> None:
        """Nothing to release."""

    def evict(self, num_tokens: int, free_fn: FreeFn) -> int:
        """Nothing to free (`free_fn` is not called)."""
        return 0

    def evictable_size(self) -> int:
        """Always 0."""
        return 0

    def protected_size(self) -> int:
        """Always 0."""
        return 0

    def total_size(self) -> int:
        """Always 0."""
        return 0

    def check_integrity(self) -> None:
        """Holds trivially: nothing is cached."""
