"""Admission: which waiting requests a prefill step takes, and how far into each prompt.

Part of the Scheduler (a mixin over its queues, KV manager and arguments). A batch is filled in
the policy's order while the prefill token budget, the running-request cap and the KV room
(after what the running requests are expected to still need) allow; a long prompt is chunked
and goes last and alone; a request that shares a long uncached prefix with one already in the
batch waits a step, so the batch caches that prefix for it.
"""

from __future__ import annotations

from arbor.radix.key import TOKEN_BYTES, common_prefix_bytes, to_key
from arbor.runtime.config import ServerArgs
from arbor.runtime.kv.manager import KVManager
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.scheduler.policy import order_waiting
from arbor.runtime.scheduler.req import Req

LOGITS_TOKEN_BUDGET = 1024  # tokens of a prefill batch that returns logits for every token
IN_BATCH_SHARE_MIN = 32  # tokens; a request sharing this much with one being prefilled waits a step


class Admission:
    """The Scheduler's choice of prefill batch."""

    args: ServerArgs
    runner: ModelRunner
    kv: KVManager
    waiting: list[Req]
    running: list[Req]
    chunked: Req | None
    last_was_chunk: bool
    admit_one: bool
    new_token_ratio: float
    counters: dict[str, float]

    def _prefill_batch(self) -> list[tuple[Req, int]]:
        """Requests to prefill now with the end position of each one's chunk."""
        if self.last_was_chunk and self.running and not self.args.enable_mixed_chunk:
            self.last_was_chunk = False
            return []  # a decode step between two chunks of a long prompt
        if not self.waiting and self.chunked is None:
            return []
        chunk_cap = self.args.chunked_prefill_size or self.runner.context_len
        budget = self.args.max_prefill_tokens
        reserved = sum(int(r.remaining_new_tokens * self.new_token_ratio) for r in self.running)
        room = self.kv.available() - reserved
        batch: list[tuple[Req, int]] = []
        if self.chunked is not None:
            req = self.chunked
            cap = min(chunk_cap, LOGITS_TOKEN_BUDGET) if req.wants_prompt_logprobs else chunk_cap
            return [(req, min(req.seq_len, req.kv_len + min(cap, budget)))]
        all_logits = False  # a batch with prompt logprobs computes logits of every token
        order = order_waiting(self.waiting, self.args.schedule_policy, self.kv, self.args.schedule_max_skips)
        for req in order:
            if len(self.running) + len(batch) >= self.args.max_running_requests or budget <= 0:
                break
            fill = req.seq_len
            prefix = self.kv.prefix_len(req)
            if self._shares_with_batch(req, prefix, batch):
                continue  # wait one step: the batch caches the shared prefix for it
            if req.wants_prompt_logprobs and not all_logits:
                if batch:
                    break  # it starts the next batch, which stays small
                all_logits, budget = True, min(budget, LOGITS_TOKEN_BUDGET)
            end = min(fill, prefix + min(chunk_cap, budget))
            future = int(req.remaining_new_tokens * self.new_token_ratio) if end == fill else 0
            cost = self.kv.pages_for(prefix, end) + future
            alone = not batch and not self.running
            if cost > room and not alone:
                break
            before = self.kv.available()
            if not self.kv.attach(req):
                break
            cost += before - self.kv.available()  # its prefix, now locked, can no longer be evicted
            if cost > room and not alone:
                self.kv.release(req)
                break
            if not req.admitted:
                req.admitted = True
                self.counters["prompt_tokens"] += len(req.origin_ids)
                self.counters["cached_tokens"] += req.cached_tokens
            room -= cost
            budget -= end - req.kv_len
            batch.append((req, end))
            if end < fill or self.admit_one:
                break  # a chunked prompt goes alone at the end of its batch
        admitted = {id(r) for r, _ in batch}
        for req in self.waiting:
            if id(req) not in admitted and req.arrival < max((r.arrival for r, _ in batch), default=0):
                req.skipped += 1
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        return batch

    def _shares_with_batch(self, req: Req, prefix: int, batch: list[tuple[Req, int]]) -> bool:
        """Whether a request already in this batch shares a long uncached prefix with `req`
        (n samples of one prompt, or few-shot requests arriving together)."""
        if not self.kv.cache.enabled or not batch:
            return False
        key = to_key(req.fill_ids())
        for other, _ in batch:
            shared = common_prefix_bytes(key, 0, to_key(other.fill_ids())) // TOKEN_BYTES
            if shared - prefix >= IN_BATCH_SHARE_MIN:
                return True
        return False

    @staticmethod
    def _all_logits(batch: list[tuple[Req, int]]) -> bool:
        return any(r.wants_prompt_logprobs for r, _ in batch)
