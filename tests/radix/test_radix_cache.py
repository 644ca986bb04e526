"""RadixCache behaviours pinned one at a time."""

from __future__ import annotations

import subprocess
import sys
from array import array

import pytest

from arbor.radix.cache import RadixCache
from arbor.radix.key import common_prefix_bytes, to_key


def _freed(cache: RadixCache, n: int) -> list[int]:
    got: list[int] = []
    cache.evict(n, got.extend)
    return got


def test_match_splits_node_on_partial_match():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5], [11, 12, 13, 14, 15])
    result = cache.match_prefix([1, 2, 3, 9])
    assert result.length == 3 and list(result.indices) == [11, 12, 13]
    assert result.last_node.num_tokens == 3  # the edge was cut after the match
    assert cache.num_nodes() == 2
    cache.check_integrity()


def test_insert_returns_already_cached_length():
    cache = RadixCache()
    assert cache.insert([1, 2, 3], [1, 2, 3]) == 0
    assert cache.insert([1, 2, 3, 4], [7, 8, 9, 10]) == 3
    assert cache.insert([1, 2], [5, 6]) == 2
    assert list(cache.match_prefix([1, 2, 3, 4]).indices) == [1, 2, 3, 10]  # the tree keeps its own


def test_evict_frees_least_recently_used_leaf_first():
    cache = RadixCache()
    cache.insert([1, 1], [1, 2])
    cache.insert([2, 2], [3, 4])
    cache.insert([3, 3], [5, 6])
    cache.match_prefix([1, 1])  # now [2, 2] is the oldest
    assert _freed(cache, 1) == [3, 4]
    assert _freed(cache, 1) == [5, 6]
    assert _freed(cache, 1) == [1, 2]


def test_parent_that_becomes_an_unlocked_leaf_is_evicted_next():
    cache = RadixCache()
    cache.insert([1, 2, 3], [1, 2, 3])
    cache.insert([1, 2, 4], [1, 2, 9])
    cache.insert([7], [7])
    cache.match_prefix([7])
    assert cache.evict(3, lambda slots: None) == 4  # both leaves, then their parent (whole)
    assert cache.total_size() == 1
    assert list(cache.match_prefix([7]).indices) == [7]


def test_evict_never_frees_locked_nodes():
    cache = RadixCache()
    cache.insert([1, 2, 3], [1, 2, 3])
    cache.insert([1, 2, 5, 6], [1, 2, 8, 9])
    handle = cache.match_prefix([1, 2, 3]).last_node
    cache.lock(handle)
    assert cache.protected_size() == 3 and cache.evictable_size() == 2
    assert _freed(cache, 100) == [8, 9]
    cache.unlock(handle)
    assert sorted(_freed(cache, 100)) == [1, 2, 3]
    assert cache.total_size() == 0


def test_lock_handle_survives_a_later_split():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [1, 2, 3, 4])
    handle = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.lock(handle)
    cache.match_prefix([1, 2, 9])  # splits the locked edge
    assert cache.protected_size() == 4
    cache.unlock(handle)
    assert cache.protected_size() == 0 and cache.evictable_size() == 4
    cache.check_integrity()


def test_unlock_of_unlocked_node_raises():
    cache = RadixCache()
    cache.insert([1], [1])
    with pytest.raises(RuntimeError, match="not locked"):
        cache.unlock(cache.match_prefix([1]).last_node)


def test_salts_never_share_nodes():
    cache = RadixCache()
    cache.insert([1, 2, 3], [1, 2, 3], cache_salt="a")
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.match_prefix([1, 2, 3], cache_salt="b").length == 0
    assert cache.insert([1, 2, 3], [4, 5, 6], cache_salt="b") == 0
    assert list(cache.match_prefix([1, 2, 3], cache_salt="a").indices) == [1, 2, 3]
    assert list(cache.match_prefix([1, 2, 3], cache_salt="b").indices) == [4, 5, 6]


def test_empty_salt_namespace_is_dropped_after_eviction():
    cache = RadixCache()
    cache.insert([1, 2], [1, 2], cache_salt="tenant")
    assert "tenant" in cache.roots()
    cache.evict(10, lambda slots: None)
    assert "tenant" not in cache.roots()


def test_page_size_caches_whole_pages_only():
    cache = RadixCache(page_size=4)
    assert cache.insert(list(range(10)), list(range(100, 110))) == 0
    assert cache.total_size() == 8  # the unaligned tail of 2 stays the caller's
    result = cache.match_prefix([*range(7), 99])
    assert result.length == 4 and list(result.indices) == [100, 101, 102, 103]
    assert cache.match_prefix([0, 1, 2]).length == 0


def test_page_size_splits_on_page_boundaries():
    cache = RadixCache(page_size=4)
    cache.insert(list(range(12)), list(range(12)))
    result = cache.match_prefix([0, 1, 2, 3, 4, 5, 99, 7])
    assert result.length == 4
    cache.check_integrity()
    assert all(node.num_tokens % 4 == 0 for node in [result.last_node])


def test_key_forms_are_equivalent():
    cache = RadixCache()
    cache.insert(array("i", [5, 6, 7]), array("i", [1, 2, 3]))
    assert cache.match_prefix([5, 6, 7]).length == 3
    assert cache.match_prefix((5, 6)).length == 2
    assert cache.match_prefix(to_key([5, 6, 7, 8])).length == 3


def test_insert_rejects_length_mismatch():
    with pytest.raises(ValueError, match="one slot per token"):
        RadixCache().insert([1, 2, 3], [1, 2])


def test_hit_statistics_count_queried_and_hit_tokens():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [1, 2, 3, 4])
    cache.match_prefix([1, 2, 3, 4])
    cache.match_prefix([1, 2, 9, 9])
    assert (cache.stats.queries, cache.stats.query_tokens, cache.stats.hit_tokens) == (2, 8, 6)
    assert cache.stats.hit_rate == 0.75
    cache.reset()
    assert cache.stats.queries == 0 and cache.total_size() == 0


def test_lru_bookkeeping_stays_bounded_under_lock_cycles():
    cache = RadixCache()
    cache.insert([1, 2], [1, 2])
    cache.insert([3, 4], [3, 4])
    for _ in range(5_000):
        handle = cache.match_prefix([1, 2]).last_node
        cache.lock(handle)
        cache.match_prefix([3, 4])
        cache.unlock(handle)  # an older stamp: tracked in the late heap
    assert max(len(cache._recent_nodes), len(cache._late)) <= cache._entry_limit <= 2048
    cache.check_integrity()
    assert _freed(cache, 2) == [1, 2]


def test_common_prefix_bytes_finds_first_mismatch():
    a = to_key(list(range(1000)))
    for cut in (0, 1, 499, 998, 999):
        b = to_key([*range(cut), -1, *range(cut + 1, 1000)])
        assert common_prefix_bytes(a, 0, b) // 4 == cut
    assert common_prefix_bytes(a, 4, to_key([1, 2, 3])) == 12


def test_dump_shows_the_tree():
    cache = RadixCache()
    cache.insert([1, 2, 3], [1, 2, 3])
    cache.insert([1, 2, 4], [1, 2, 4], cache_salt="s")
    text = cache.dump()
    assert "[1, 2, 3] len=3" in text and "salt='s'" in text


def test_radix_does_not_import_torch():
    code = "import sys, radix; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
