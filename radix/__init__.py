"""Token-level radix tree of KV-cache pages with LRU eviction (pure Python, no torch)."""

from radix.cache import CacheStats, MatchResult, RadixCache
from radix.key import TOKEN_BYTES, common_prefix_bytes, to_key, to_values
from radix.node import TreeNode

__all__ = ["TOKEN_BYTES", "CacheStats", "MatchResult", "RadixCache", "TreeNode", "common_prefix_bytes", "to_key", "to_values"]
