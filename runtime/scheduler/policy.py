"""Which waiting request goes first: LPM (longest cached prefix) or FCFS, with anti-starvation."""

from __future__ import annotations

from arbor.runtime.kv.manager import KVManager
from arbor.runtime.scheduler.req import Req

LPM_MAX_QUEUE = 256  # past this many waiting requests, matching each one costs more than it saves


def order_waiting(waiting: list[Req], policy: str, kv: KVManager, max_skips: int) -> list[Req]:
    """Waiting requests in admission order.

    Retracted requests and requests passed over `max_skips` times come first, oldest first;
    then LPM sorts by cached-prefix length (ties by arrival), FCFS by arrival.
    """
    urgent = sorted((r for r in waiting if r.retractions or r.skipped >= max_skips), key=lambda r: r.arrival)
    rest = [r for r in waiting if not (r.retractions or r.skipped >= max_skips)]
    # Without a cache every match is 0 and LPM is FCFS: skip the lookups.
    if policy == "lpm" and kv.cache.enabled and len(rest) <= LPM_MAX_QUEUE:
        for r in rest:
            r.prefix_matched = kv.prefix_len(r)
        rest.sort(key=lambda r: (-r.prefix_matched, r.arrival))
    else:
        rest.sort(key=lambda r: r.arrival)
    return urgent + rest
