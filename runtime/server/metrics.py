"""Prometheus metrics of the server (prometheus-client, one registry per app)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """Request latencies and token counters; scheduler gauges are refreshed at scrape time."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("arbor_time_to_first_token_seconds", "Time to first token (streamed requests).",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("arbor_inter_token_latency_seconds", "Time between streamed outputs.",
                             buckets=_LATENCY, registry=r)
        self.tpot = Histogram("arbor_time_per_output_token_seconds", "(e2e - ttft) / (completion tokens - 1).",
                              buckets=_LATENCY, registry=r)
        self.e2e = Histogram("arbor_e2e_request_latency_seconds", "Request latency, arrival to last token.",
                             buckets=_LATENCY, registry=r)
        self.prompt_tokens = Counter("arbor_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("arbor_generation_tokens", "Generated tokens.", registry=r)
        self.cached_tokens = Counter("arbor_cached_tokens", "Prompt tokens served from the radix cache.", registry=r)
        self.requests = Counter("arbor_requests", "Finished requests by finish reason.", ["reason"], registry=r)
        self.running = Gauge("arbor_num_running_requests", "Requests decoding now.", registry=r)
        self.waiting = Gauge("arbor_num_waiting_requests", "Requests waiting for admission.", registry=r)
        self.kv_usage = Gauge("arbor_kv_cache_usage", "Fraction of KV slots in use (requests + cache).", registry=r)
        self.hit_rate = Gauge("arbor_cache_hit_rate", "Radix cache hit rate: tokens hit / tokens queried.",
                              registry=r)

    async def timed(self, outputs: AsyncIterator[dict[str, Any]], streamed: bool) -> AsyncIterator[dict[str, Any]]:
        """Pass outputs through, observing latencies and counting tokens of finished samples.
        Token timings need a streamed request (others arrive all at once)."""
        start = time.perf_counter()
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        async for out in outputs:
            now = time.perf_counter()
            meta = out["meta_info"]
            rid = meta["id"]
            if not streamed:
                pass
            elif rid not in first and out["output_ids"]:
                first[rid] = now
                self.ttft.observe(now - start)
            elif rid in last:
                self.itl.observe(now - last[rid])
            last[rid] = now
            if meta["finish_reason"] is not None:
                self._finished(meta, start, first.get(rid), now)
            yield out

    def _finished(self, meta: dict[str, Any], start: float, first: float | None, now: float) -> None:
        self.e2e.observe(now - start)
        n = meta["completion_tokens"]
        if first is not None and n > 1:
            self.tpot.observe((now - first) / (n - 1))
        self.prompt_tokens.inc(meta["prompt_tokens"])
        self.generation_tokens.inc(n)
        self.cached_tokens.inc(meta["cached_tokens"])
        self.requests.labels(meta["finish_reason"]["type"]).inc()

    def render(self, stats: dict[str, float]) -> bytes:
        self.running.set(stats.get("running", 0))
        self.waiting.set(stats.get("waiting", 0))
        total = stats.get("total_slots", 0) or 1
        self.kv_usage.set(1 - stats.get("free_slots", total) / total)
        self.hit_rate.set(stats.get("cache_hit_rate", 0))
        return generate_latest(self.registry)
