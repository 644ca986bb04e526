"""PrefixCache: the contract between the KV manager and whatever reuses KV of shared prefixes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from arbor.radix.key import TokenIds
from arbor.radix.node import TreeNode

FreeFn: TypeAlias = "Callable[[array[int]], object]"


class MatchResult(NamedTuple):
    """Longest cached prefix: its KV slots, the node ending it (a lock handle), its length."""

    indices: array[int]
    last_node: TreeNode
    length: int


@dataclass
class CacheStats:
    """Prefix-hit counters over every `match_prefix` call since the last reset."""

    queries: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        """Fraction of queried tokens that were served from the cache."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


class PrefixCache(ABC):
    """Token sequences (namespaced by `cache_salt`) mapped to the KV slots that hold them.

    Ownership: every slot passed to `insert` belongs to the cache from then on, except the
    leading span `insert` reports as already cached (the caller frees its own duplicates
    there and adopts the cache's slots) and any tail past `cacheable_len` (still the
    caller's). The cache hands slots back only through `evict`'s `free_fn`.
    Locking: a caller that uses `match_prefix(...).indices` across a step `lock`s the
    returned `last_node` first and `unlock`s it when done; a locked path is never evicted.
    Sizes: `evictable_size() + protected_size() == total_size()`, the slots the cache owns.
    Callers match a prompt on at most `len - 1` tokens, so at least one token is computed.
    """

    stats: CacheStats

    @property
    @abstractmethod
    def enabled(self) -> bool:
        """Whether anything is ever cached (False for the no-cache stand-in)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every cached sequence (the caller owns freeing their slots) and the stats."""

    @abstractmethod
    def match_prefix(self, key: TokenIds, cache_salt: str | None = None) -> MatchResult:
        """Longest cached prefix of `key`, rounded down to whole pages; refreshes its LRU time.

        A match ending inside a cached span splits it, so `last_node` covers exactly the match.
        """

    @abstractmethod
    def insert(self, key: TokenIds, indices: array[int] | TokenIds, cache_salt: str | None = None) -> int:
        """Offer `key` -> `indices` (one slot per token); return how many leading tokens were
        already cached. The cache keeps [that, `cacheable_len(len(key))`)."""

    @abstractmethod
    def cacheable_len(self, num_tokens: int) -> int:
        """Leading tokens of an inserted sequence of `num_tokens` that the cache owns afterwards."""

    @abstractmethod
    def lock(self, node: TreeNode) -> None:
        """Protect the path from `node` to its root against eviction (reference counted)."""

    @abstractmethod
    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`; a path no request holds becomes evictable again."""

    @abstractmethod
    def evict(self, num_tokens: int, free_fn: FreeFn) -> int:
        """Free least-recently-used unlocked entries until `num_tokens` are freed or none is
        left; pass the freed slots to `free_fn` (once, only if any) and return their count."""

    @abstractmethod
    def evictable_size(self) -> int:
        """Cached tokens that no running request holds."""

    @abstractmethod
    def protected_size(self) -> int:
        """Cached tokens on locked paths."""

    @abstractmethod
    def total_size(self) -> int:
        """All cached tokens (each owns one KV slot)."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Recount the cache from its own structure; raise RuntimeError on any mismatch."""
