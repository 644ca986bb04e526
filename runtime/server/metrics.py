"""Prometheus metrics of the server (prometheus-client, one registry per app).

Each series is exported twice: as `arbor_*`, and under SGLang's `sglang:*` names and
labels (`model_name`, `is_streaming`), so existing SGLang Grafana dashboards work.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from arbor.runtime.io.outputs import GenerateOutput, MetaInfo

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _SGLangSeries:
    """The same measurements under SGLang's metric names."""

    def __init__(self, r: CollectorRegistry, model: str) -> None:
        m, ms = ["model_name"], ["model_name", "is_streaming"]
        self.model = model
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Time to first token.", m, buckets=_LATENCY, registry=r
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Inter-token latency.", m, buckets=_LATENCY, registry=r
        )
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds", "Time per output token.", m, buckets=_LATENCY, registry=r
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "End-to-end request latency.", ms, buckets=_LATENCY, registry=r
        )
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens.", ms, registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generated tokens.", ms, registry=r)
        self.cached_tokens = Counter("sglang:cached_tokens", "Prompt tokens served from the cache.", m, registry=r)
        self.requests = Counter("sglang:num_requests", "Finished requests.", ms, registry=r)
        self.running = Gauge("sglang:num_running_reqs", "Running requests.", m, registry=r)
        self.queued = Gauge("sglang:num_queue_reqs", "Queued requests.", m, registry=r)
        self.token_usage = Gauge("sglang:token_usage", "Fraction of KV slots in use.", m, registry=r)
        self.hit_rate = Gauge("sglang:cache_hit_rate", "Prefix cache hit rate.", m, registry=r)
        self.spec_accept = Gauge(
            "sglang:spec_accept_length", "Mean tokens committed per speculative verify.", m, registry=r
        )


class Metrics:
    """Request latencies and token counters; scheduler gauges are refreshed at scrape time."""

    def __init__(self, model_name: str = "default") -> None:
        r = self.registry = CollectorRegistry()
        self.sgl = _SGLangSeries(r, model_name)
        self.ttft = Histogram(
            "arbor_time_to_first_token_seconds",
            "Time to first token (streamed requests).",
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "arbor_inter_token_latency_seconds", "Time between streamed outputs.", buckets=_LATENCY, registry=r
        )
        self.tpot = Histogram(
            "arbor_time_per_output_token_seconds",
            "(e2e - ttft) / (completion tokens - 1).",
            buckets=_LATENCY,
            registry=r,
        )
        self.e2e = Histogram(
            "arbor_e2e_request_latency_seconds", "Request latency, arrival to last token.", buckets=_LATENCY, registry=r
        )
        self.prompt_tokens = Counter("arbor_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("arbor_generation_tokens", "Generated tokens.", registry=r)
        self.cached_tokens = Counter("arbor_cached_tokens", "Prompt tokens served from the radix cache.", registry=r)
        self.requests = Counter("arbor_requests", "Finished requests by finish reason.", ["reason"], registry=r)
        self.running = Gauge("arbor_num_running_requests", "Requests decoding now.", registry=r)
        self.waiting = Gauge("arbor_num_waiting_requests", "Requests waiting for admission.", registry=r)
        self.kv_usage = Gauge("arbor_kv_cache_usage", "Fraction of KV slots in use (requests + cache).", registry=r)
        self.hit_rate = Gauge("arbor_cache_hit_rate", "Radix cache hit rate: tokens hit / tokens queried.", registry=r)
        self.spec_accept = Gauge(
            "arbor_spec_accept_length",
            "Speculative decoding: mean tokens a request commits per verify step (1 + accepted guesses; 0 before any).",
            registry=r,
        )
        # Prefill/decode disaggregation, totals since start: KV a prefill worker sent, or a decode
        # worker received (its seconds run from the pull to the KV's arrival, prefill included).
        self.transfers = {
            name: Gauge(f"arbor_{name}", text, registry=r)
            for name, text in (
                ("kv_transfers", "KV transfers finished (sent or received)."),
                ("kv_transfer_bytes", "Bytes of KV sent to decode workers, or received from prefill workers."),
                ("kv_transfer_seconds", "Seconds KV transfers took, summed; divided by kv_transfers, the mean."),
                ("kv_transfer_failures", "KV transfers that failed, timed out or were refused."),
                (
                    "bootstrap_rejected",
                    "Bootstrap messages and transfer notifications dropped: unsigned, malformed, "
                    "or for no pull of their sender.",
                ),
            )
        }

    async def timed(self, outputs: AsyncIterator[GenerateOutput], streamed: bool) -> AsyncIterator[GenerateOutput]:
        """Pass outputs through, observing latencies and counting tokens of finished samples.
        Token timings need a streamed request (others arrive all at once)."""
        start = time.perf_counter()
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        model = self.sgl.model
        async for out in outputs:
            now = time.perf_counter()
            meta = out.meta_info
            rid = meta.id
            if not streamed:
                pass
            elif rid not in first and out.output_ids:
                first[rid] = now
                self.ttft.observe(now - start)
                self.sgl.ttft.labels(model).observe(now - start)
            elif rid in last:
                self.itl.observe(now - last[rid])
                self.sgl.itl.labels(model).observe(now - last[rid])
            last[rid] = now
            if meta.finish_reason is not None:
                self._finished(meta, start, first.get(rid), now, streamed)
            yield out

    def _finished(self, meta: MetaInfo, start: float, first: float | None, now: float, streamed: bool) -> None:
        sgl, model, stream = self.sgl, self.sgl.model, str(streamed).lower()
        self.e2e.observe(now - start)
        sgl.e2e.labels(model, stream).observe(now - start)
        n = meta.completion_tokens
        if first is not None and n > 1:
            self.tpot.observe((now - first) / (n - 1))
            sgl.tpot.labels(model).observe((now - first) / (n - 1))
        self.prompt_tokens.inc(meta.prompt_tokens)
        self.generation_tokens.inc(n)
        self.cached_tokens.inc(meta.cached_tokens)
        self.requests.labels(type(meta.finish_reason).__name__.removeprefix("Finish").lower()).inc()
        sgl.prompt_tokens.labels(model, stream).inc(meta.prompt_tokens)
        sgl.generation_tokens.labels(model, stream).inc(n)
        sgl.cached_tokens.labels(model).inc(meta.cached_tokens)
        sgl.requests.labels(model, stream).inc()

    def render(self, stats: dict[str, float]) -> bytes:
        """The exposition text, with the scheduler gauges set from `stats`."""
        total = stats.get("total_slots", 0) or 1
        usage = 1 - stats.get("free_slots", total) / total
        model = self.sgl.model
        for arbor, sgl, value in (
            (self.running, self.sgl.running, stats.get("running", 0)),
            (self.waiting, self.sgl.queued, stats.get("waiting", 0)),
            (self.kv_usage, self.sgl.token_usage, usage),
            (self.hit_rate, self.sgl.hit_rate, stats.get("cache_hit_rate", 0)),
            (self.spec_accept, self.sgl.spec_accept, stats.get("spec_accept_length", 0)),
        ):
            arbor.set(value)
            sgl.labels(model).set(value)
        for name, gauge in self.transfers.items():
            gauge.set(stats.get(name, 0))
        return generate_latest(self.registry)
