"""Every PrefixCache implementation keeps the contract its base class documents."""

from __future__ import annotations

from array import array
from collections.abc import Callable

import pytest

from arbor.radix.cache import RadixCache
from arbor.radix.null_cache import NullPrefixCache
from arbor.radix.prefix_cache import PrefixCache

IMPLEMENTATIONS: dict[str, Callable[[], PrefixCache]] = {
    "radix-page1": lambda: RadixCache(1),
    "radix-page4": lambda: RadixCache(4),
    "null": NullPrefixCache,
}
PROMPT = list(range(100, 118))  # 18 tokens: not a whole number of 4-token pages
SLOTS = list(range(1000, 1018))


@pytest.fixture(params=list(IMPLEMENTATIONS))
def cache(request: pytest.FixtureRequest) -> PrefixCache:
    return IMPLEMENTATIONS[request.param]()


def _sizes_hold(cache: PrefixCache) -> None:
    assert min(cache.evictable_size(), cache.protected_size()) >= 0
    assert cache.evictable_size() + cache.protected_size() == cache.total_size()
    cache.check_integrity()


def _evict_all(cache: PrefixCache) -> list[int]:
    freed: list[int] = []
    calls: list[int] = []
    count = cache.evict(10**9, lambda slots: (calls.append(1), freed.extend(slots)))
    assert count == len(freed) and len(calls) == (1 if freed else 0)  # free_fn: once, only if any
    return freed


def test_is_a_prefix_cache(cache: PrefixCache):
    assert isinstance(cache, PrefixCache)
    _sizes_hold(cache)
    assert cache.total_size() == 0


def test_empty_cache_matches_nothing(cache: PrefixCache):
    match = cache.match_prefix(PROMPT)
    assert match.length == 0 and len(match.indices) == 0
    cache.lock(match.last_node)  # the handle of an empty match can be locked and unlocked
    cache.unlock(match.last_node)
    _sizes_hold(cache)


def test_insert_keeps_cacheable_len_and_match_returns_those_slots(cache: PrefixCache):
    kept = cache.cacheable_len(len(PROMPT))
    assert 0 <= kept <= len(PROMPT)
    assert cache.insert(PROMPT, SLOTS) == 0
    assert cache.total_size() == kept
    assert (kept > 0) == cache.enabled  # only the stand-in declines everything
    match = cache.match_prefix(PROMPT)
    assert match.length == kept and list(match.indices) == SLOTS[:kept]
    _sizes_hold(cache)


def test_insert_reports_already_cached_and_keeps_its_own_slots(cache: PrefixCache):
    cache.insert(PROMPT, SLOTS)
    kept = cache.cacheable_len(len(PROMPT))
    other = [s + 5000 for s in SLOTS]
    assert cache.insert(PROMPT, other) == kept  # the caller frees other[:kept], its duplicates
    assert cache.total_size() == kept
    assert list(cache.match_prefix(PROMPT).indices) == SLOTS[:kept]


def test_match_rounds_down_to_pages_and_splits(cache: PrefixCache):
    cache.insert(PROMPT, SLOTS)
    probe = [*PROMPT[:10], 7, 7, 7, 7, 7, 7]
    match = cache.match_prefix(probe)
    assert match.length == min(cache.cacheable_len(10), cache.cacheable_len(len(PROMPT)))
    assert list(match.indices) == SLOTS[: match.length]
    cache.lock(match.last_node)  # the handle covers exactly the match
    assert cache.protected_size() == match.length
    cache.unlock(match.last_node)
    _sizes_hold(cache)


def test_cache_salt_namespaces_never_share(cache: PrefixCache):
    cache.insert(PROMPT, SLOTS, cache_salt="tenant-a")
    assert cache.match_prefix(PROMPT, "tenant-b").length == 0
    assert cache.match_prefix(PROMPT).length == 0
    assert cache.match_prefix(PROMPT, "tenant-a").length == cache.cacheable_len(len(PROMPT))


def test_locked_paths_are_never_evicted(cache: PrefixCache):
    cache.insert(PROMPT, SLOTS)
    cache.insert([1] * 8, list(range(8)))
    match = cache.match_prefix(PROMPT)
    cache.lock(match.last_node)
    cache.lock(match.last_node)  # reference counted
    assert cache.protected_size() == match.length
    freed = _evict_all(cache)
    assert not set(freed) & set(match.indices)
    assert sorted(freed) == list(range(cache.cacheable_len(8)))
    cache.unlock(match.last_node)
    assert _evict_all(cache) == [] and cache.protected_size() == match.length
    cache.unlock(match.last_node)
    assert cache.evictable_size() == match.length == cache.total_size()
    _sizes_hold(cache)


def test_evict_returns_every_slot_the_cache_owns(cache: PrefixCache):
    cache.insert(PROMPT, SLOTS)
    total = cache.total_size()
    freed = _evict_all(cache)
    assert sorted(freed) == SLOTS[:total]
    assert cache.total_size() == 0 and cache.match_prefix(PROMPT).length == 0
    _sizes_hold(cache)


def test_evict_stops_once_enough_is_freed(cache: PrefixCache):
    cache.insert([1] * 8, list(range(8)))
    cache.insert([2] * 8, list(range(8, 16)))
    freed: list[int] = []
    cache.evict(1, freed.extend)
    assert len(freed) == (8 if cache.enabled else 0)  # one least-recently-used entry, not both
    _sizes_hold(cache)


def test_reset_forgets_everything_and_the_stats(cache: PrefixCache):
    cache.insert(PROMPT, SLOTS)
    cache.match_prefix(PROMPT)
    cache.reset()
    assert cache.total_size() == 0 and cache.match_prefix(PROMPT).length == 0
    assert cache.stats.queries == 1 and cache.stats.hit_tokens == 0
    _sizes_hold(cache)


def test_hit_statistics_count_queries(cache: PrefixCache):
    cache.insert(PROMPT, SLOTS)
    cache.match_prefix(PROMPT)
    cache.match_prefix(array("i", PROMPT[:8]))
    stats = cache.stats
    assert stats.queries == 2 and stats.query_tokens == len(PROMPT) + 8
    assert stats.hit_tokens == cache.cacheable_len(len(PROMPT)) + cache.cacheable_len(8)
    assert 0.0 <= stats.hit_rate <= 1.0
