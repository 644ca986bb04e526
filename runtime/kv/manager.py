"""KVManager: who owns which KV slot, across the page allocator, the slot table and the prefix cache."""

from __future__ import annotations

import logging
from array import array
from collections.abc import Sequence

import numpy as np
import torch

from arbor.radix.cache import RadixCache
from arbor.radix.null_cache import NullPrefixCache
from arbor.radix.prefix_cache import PrefixCache
from arbor.runtime.config import CacheArgs
from arbor.runtime.kv.pool import PageAllocator, ReqToTokenPool, reserve_positions
from arbor.runtime.scheduler.req import Req

logger = logging.getLogger(__name__)


def _ceil(n: int, page: int) -> int:
    return -(-n // page) * page


def make_prefix_cache(cache: CacheArgs) -> PrefixCache:
    """The radix tree, or the no-cache stand-in under `--disable-radix-cache`."""
    return NullPrefixCache() if cache.disable_radix_cache else RadixCache(cache.page_size)


class KVManager:
    """Attaches requests to KV (reusing the longest cached prefix), grows them, caches and frees.

    Invariant: free + cache evictable + cache protected + private slots of attached requests
    == total slots. `check()` verifies it.
    """

    def __init__(self, allocator: PageAllocator, req_to_token: ReqToTokenPool, cache: PrefixCache) -> None:
        self.allocator = allocator
        self.req_to_token = req_to_token
        self.cache = cache
        self.page = allocator.page_size
        self.attached: set[Req] = set()

    # ------------------------------------------------------------- capacity

    def available(self) -> int:
        """Slots free now or after evicting every unlocked cached prefix."""
        return self.allocator.available() + self.cache.evictable_size()

    def pages_for(self, start: int, end: int) -> int:
        """New slots (whole pages) that positions [start, end) of a request need."""
        return _ceil(end, self.page) - _ceil(start, self.page)

    def make_room(self, num_slots: int) -> bool:
        """Evict cached prefixes until `num_slots` are free; whether that succeeded."""
        short = num_slots - self.allocator.available()
        if short > 0:
            self.cache.evict(short, self._free_array)
        return self.allocator.available() >= num_slots

    # ------------------------------------------------------------ lifecycle

    def prefix_len(self, req: Req) -> int:
        """Length of the cached prefix `req` would reuse (at most `req.match_cap`)."""
        return self.cache.match_prefix(req.fill_ids()[: req.match_cap], req.cache_salt).length

    def attach(self, req: Req) -> bool:
        """Give `req` a slot-table row holding its cached prefix (locked); False if no row is free."""
        row = self.req_to_token.alloc()
        if row is None:
            return False
        req.row = row
        match = self.cache.match_prefix(req.fill_ids()[: req.match_cap], req.cache_salt)
        matched = match.length
        if matched:
            self.req_to_token.table[row, :matched] = torch.frombuffer(match.indices, dtype=torch.int32)
        self.cache.lock(match.last_node)
        req.last_node = match.last_node
        if req.retractions == 0:
            req.cached_tokens = matched
        req.tree_len = req.kv_len = req.mapped_len = matched
        self.attached.add(req)
        return True

    def reserve(self, reqs: Sequence[Req], ends: Sequence[int]) -> torch.Tensor | None:
        """Slots for positions [kv_len, end) of each request (evicting as needed), or None."""
        p = self.page  # pages_for, inlined: this runs for every running request each step
        need = p * sum(-(-e // p) + (r.mapped_len // -p) for r, e in zip(reqs, ends))
        if not self.make_room(need):
            return None
        starts = [r.kv_len for r in reqs]
        loc = reserve_positions(self.req_to_token, self.allocator, [r.row for r in reqs], starts, list(ends))
        assert loc is not None, "make_room freed enough pages"
        for r, e in zip(reqs, ends):
            r.mapped_len = max(r.mapped_len, _ceil(e, self.page))
        return loc

    def slots(self, req: Req, start: int, end: int) -> np.ndarray:
        """The KV slots of positions [start, end) of an attached request."""
        return self.req_to_token.table[req.row, start:end].cpu().numpy()

    def truncate(self, req: Req, length: int) -> None:
        """Unmap positions from `length` on (rejected speculative guesses), freeing the pages
        wholly past it; their K/V, written by the verify step, is garbage from now on."""
        keep = _ceil(length, self.page)
        if req.mapped_len > keep:
            self.allocator.free_slots(self.req_to_token.table[req.row, keep : req.mapped_len].to(torch.int64))
            req.mapped_len = keep

    def cache_prefix(self, req: Req) -> None:
        """Insert the KV computed so far into the cache and adopt the cache's slots for it."""
        aligned = self._insert(req)
        ids = req.fill_ids()[:aligned]
        match = self.cache.match_prefix(ids, req.cache_salt)
        assert match.length == aligned, "a prefix just inserted is cached"
        if aligned:
            self.req_to_token.table[req.row, :aligned] = torch.frombuffer(match.indices, dtype=torch.int32)
        self.cache.lock(match.last_node)
        assert req.last_node is not None  # an attached request holds a lock
        self.cache.unlock(req.last_node)
        req.last_node = match.last_node
        req.tree_len = aligned

    def release(self, req: Req) -> None:
        """Detach `req`: cache what it computed, free its private slots and its row."""
        table = self.req_to_token.table
        aligned = self._insert(req)
        assert req.last_node is not None  # an attached request holds a lock
        self.cache.unlock(req.last_node)
        if req.mapped_len > aligned:
            self.allocator.free_slots(table[req.row, aligned : req.mapped_len].to(torch.int64))
        self.req_to_token.free(req.row)
        self.attached.discard(req)
        req.row, req.last_node = -1, None
        req.tree_len = req.kv_len = req.mapped_len = 0

    def _insert(self, req: Req) -> int:
        """Offer [0, kv_len) to the cache; free this request's duplicates of spans the cache
        already held. Returns the length the cache now owns (whole pages; 0 without a cache)."""
        n = req.kv_len
        aligned = self.cache.cacheable_len(n)
        if not aligned:
            return 0  # nothing the cache would keep, so nothing it held before either
        ids = req.fill_ids()[:n]
        slots = array("i", self.req_to_token.table[req.row, :n].numpy().tobytes()) if n else array("i")
        cached = self.cache.insert(ids, slots, req.cache_salt)
        if cached > req.tree_len:
            dup = self.req_to_token.table[req.row, req.tree_len : cached].to(torch.int64)
            self.allocator.free_slots(dup)
        return aligned

    def _free_array(self, slots: array[int]) -> None:
        self.allocator.free_slots(torch.frombuffer(slots, dtype=torch.int32).to(torch.int64))

    # ------------------------------------------------------------ integrity

    def check(self) -> str | None:
        """None when the slot invariant holds, else a message with the numbers."""
        free = self.allocator.available()
        evictable = self.cache.evictable_size()
        protected = self.cache.protected_size()
        private = sum(r.mapped_len - r.tree_len for r in self.attached)
        total = self.allocator.total_slots
        if free + evictable + protected + private != total:
            return (
                f"KV slot leak: free {free} + evictable {evictable} + protected {protected} "
                f"+ private {private} = {free + evictable + protected + private} != total {total}"
            )
        self.cache.check_integrity()
        return None
