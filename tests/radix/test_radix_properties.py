"""RadixCache against a brute-force reference: a dict of every cached (salt, prefix) -> page.

The reference keys every cached prefix whose length is a whole number of pages; its value is
the tuple of slots of that prefix's last page.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from arbor.radix.cache import RadixCache

SALTS = st.sampled_from([None, "tenant-a", "tenant-b"])


class RadixVersusReference(RuleBasedStateMachine):
    """Random inserts, matches, locks, unlocks and evictions, checked after every step."""

    page_size = 1

    def __init__(self) -> None:
        super().__init__()
        self.cache = RadixCache(self.page_size)
        self.ref: dict[tuple, tuple[int, ...]] = {}  # (salt, prefix) -> slots of its last page
        self.stamp: dict[tuple, int] = {}  # (salt, prefix tuple) -> reference clock of last touch
        self.clock = 0
        self.owned: set[int] = set()  # slots the tree owns
        self.freed: set[int] = set()
        self.next_slot = 1
        self.keys: list[tuple[int, ...]] = []
        self.handles: list[tuple[object, object, tuple[int, ...]]] = []  # node, salt, prefix

    # ------------------------------------------------------------- helpers

    def draw_key(self, data: st.DataObject) -> list[int]:
        """A fresh key, or a prefix of an earlier one plus a suffix, so prefixes are shared."""
        p = self.page_size
        base: list[int] = []
        if self.keys and data.draw(st.booleans()):
            earlier = data.draw(st.sampled_from(self.keys))
            base = list(earlier[: data.draw(st.integers(0, len(earlier)))])
        suffix = data.draw(st.lists(st.integers(0, 2), max_size=2 * p + 3))
        return base + suffix

    def longest(self, salt: object, key: list[int]) -> int:
        p = self.page_size
        k = 0
        while k + p <= len(key) and (salt, tuple(key[: k + p])) in self.ref:
            k += p
        return k

    def touch(self, salt: object, key: list[int], n: int) -> None:
        self.clock += 1
        for end in range(self.page_size, n + 1, self.page_size):
            self.stamp[(salt, tuple(key[:end]))] = self.clock

    def locked_pages(self) -> set[tuple]:
        p = self.page_size
        return {(salt, prefix[:end]) for _, salt, prefix in self.handles for end in range(p, len(prefix) + 1, p)}

    # --------------------------------------------------------------- rules

    @rule(data=st.data(), salt=SALTS)
    def insert(self, data: st.DataObject, salt: object) -> None:
        key = self.draw_key(data)
        slots = list(range(self.next_slot, self.next_slot + len(key)))
        self.next_slot += len(key)
        expected = self.longest(salt, key)
        assert self.cache.insert(key, slots, cache_salt=salt) == expected
        aligned = len(key) - len(key) % self.page_size
        for end in range(expected + self.page_size, aligned + 1, self.page_size):
            self.ref[(salt, tuple(key[:end]))] = tuple(slots[end - self.page_size : end])
        self.owned.update(slots[expected:aligned])
        self.touch(salt, key, aligned)
        self.keys.append(tuple(key))

    @rule(data=st.data(), salt=SALTS, lock=st.booleans())
    def match(self, data: st.DataObject, salt: object, lock: bool) -> None:
        key = self.draw_key(data)
        result = self.cache.match_prefix(key, cache_salt=salt)
        expected = self.longest(salt, key)
        assert result.length == expected == len(result.indices)
        pages = [self.ref[(salt, tuple(key[:end]))] for end in range(self.page_size, expected + 1, self.page_size)]
        assert list(result.indices) == [slot for page in pages for slot in page]
        self.touch(salt, key, expected)
        if lock:
            self.cache.lock(result.last_node)
            self.handles.append((result.last_node, salt, tuple(key[:expected])))

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def unlock(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.handles) - 1))
        node, _, _ = self.handles.pop(i)
        self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 80))
    def evict(self, num_tokens: int) -> None:
        got: list[int] = []
        freed = self.cache.evict(num_tokens, got.extend)
        assert freed == len(got)
        assert not self.freed.intersection(got), "a slot was freed twice"
        assert set(got) <= self.owned, "freed a slot the tree did not own"
        assert len(set(got)) == len(got)
        locked = self.locked_pages()
        locked_slots = {slot for p in locked for slot in self.ref[p]}
        assert not locked_slots.intersection(got), "evicted a locked slot"
        gone = set(got)
        evicted = [p for p, page in self.ref.items() if page[0] in gone]
        assert all(set(self.ref[p]) <= gone for p in evicted), "evicted part of a page"
        remaining = [p for p, page in self.ref.items() if page[0] not in gone and p not in locked]
        if evicted and remaining:
            assert max(self.stamp[p] for p in evicted) <= min(self.stamp[p] for p in remaining), "not LRU"
        for p in evicted:
            del self.ref[p]
        self.owned -= gone
        self.freed |= gone
        for salt, prefix in self.ref:
            parent = prefix[: -self.page_size]
            assert not parent or (salt, parent) in self.ref, "an evicted slot is still reachable"
        assert freed >= num_tokens or self.cache.evictable_size() == 0

    # ---------------------------------------------------------- invariants

    @invariant()
    def sizes_add_up(self) -> None:
        total = len(self.ref) * self.page_size
        protected = len(self.locked_pages()) * self.page_size
        assert self.cache.total_size() == total
        assert self.cache.protected_size() == protected
        assert self.cache.evictable_size() == total - protected
        assert self.cache.evictable_size() + self.cache.protected_size() == self.cache.total_size()
        self.cache.check_integrity()


class RadixPage4(RadixVersusReference):
    page_size = 4


class RadixPage16(RadixVersusReference):
    page_size = 16


_settings = settings(max_examples=80, stateful_step_count=40, deadline=None)
TestRadixPage1 = RadixVersusReference.TestCase
TestRadixPage1.settings = _settings
TestRadixPage4 = RadixPage4.TestCase
TestRadixPage4.settings = _settings
TestRadixPage16 = RadixPage16.TestCase
TestRadixPage16.settings = _settings
