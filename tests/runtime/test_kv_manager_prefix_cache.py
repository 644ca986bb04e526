"""KVManager over each PrefixCache: the slot invariant holds, and only a real cache shares slots."""

from __future__ import annotations

from array import array

import pytest
import torch

from arbor.runtime.config import CacheArgs
from arbor.runtime.kv.manager import KVManager, make_prefix_cache
from arbor.runtime.kv.pool import PageAllocator, ReqToTokenPool
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.scheduler.req import Req

PAGE = 4


def _run(kv: KVManager, rid: str, prompt: list[int]) -> Req:
    """Attach a request, compute its whole prompt, and cache it."""
    req = Req(rid, array("i", prompt), SamplingParams())
    assert kv.attach(req)
    assert kv.reserve([req], [req.seq_len]) is not None
    req.kv_len = req.seq_len
    kv.cache_prefix(req)
    assert kv.check() is None
    return req


@pytest.mark.parametrize("disabled", [False, True], ids=["radix", "null"])
def test_slot_invariant_holds_and_prefixes_are_shared_only_with_a_cache(disabled: bool):
    allocator = PageAllocator(256, PAGE)
    kv = KVManager(
        allocator,
        ReqToTokenPool(4, 64, torch.device("cpu"), PAGE),
        make_prefix_cache(CacheArgs(page_size=PAGE, disable_radix_cache=disabled)),
    )
    prompt = list(range(1, 19))  # 18 tokens: four whole pages and a tail
    first = _run(kv, "a", prompt)
    second = _run(kv, "b", prompt)
    assert second.cached_tokens == (0 if disabled else 16)  # at most len - 1, in whole pages
    assert kv.prefix_len(Req("c", array("i", prompt), SamplingParams())) == (0 if disabled else 16)
    for req in (first, second):
        kv.release(req)
        assert kv.check() is None
    assert kv.cache.total_size() == (0 if disabled else 16)
    assert kv.make_room(allocator.total_slots)  # evicting every unlocked prefix frees the whole pool
    assert allocator.available() == allocator.total_slots and kv.check() is None
