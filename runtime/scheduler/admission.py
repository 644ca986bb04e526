"""Admission: what the next step runs. Which waiting requests a prefill takes and how far
into each prompt, whether the running requests decode in the same forward, or decode alone.

A batch is filled in the policy's order while the prefill token budget, the running-request
cap and the KV room (after what the running requests are expected to still need) allow; a long
prompt is chunked and goes last and alone; a request that shares a long uncached prefix with
one already in the batch waits a step, so the batch caches that prefix for it.
"""

from __future__ import annotations

from arbor.radix.key import TOKEN_BYTES, common_prefix_bytes, to_key
from arbor.runtime.config import SchedulerArgs
from arbor.runtime.kv.manager import KVManager
from arbor.runtime.scheduler.policy import order_waiting
from arbor.runtime.scheduler.req import Req, ReqStatus
from arbor.runtime.scheduler.stats import SchedulerStats
from arbor.runtime.scheduler.step_plan import IDLE, StepPlan, decode_plan, prefill_plan

LOGITS_TOKEN_BUDGET = 1024  # tokens of a prefill batch that returns logits for every token
IN_BATCH_SHARE_MIN = 32  # tokens; a request sharing this much with one being prefilled waits a step
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001
RETRACT_NEW_TOKEN_RATIO_STEP = 0.1


class Admission:
    """Plans each step, and owns the state that carries from one step to the next: the prompt
    being prefilled chunk by chunk, and the estimate of how many more tokens a running
    request will take (it falls while decoding goes well and rises at each retraction)."""

    def __init__(self, config: SchedulerArgs, kv: KVManager, context_len: int, stats: SchedulerStats) -> None:
        self.config = config
        self.kv = kv
        self.context_len = context_len
        self.stats = stats
        self.chunked: Req | None = None  # mid-prefill of a long prompt
        self.last_was_chunk = False  # without mixed steps, a decode step comes between two chunks
        self.admit_one = False  # after a prefill could not reserve its KV: admit one request only
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO

    # ------------------------------------------------------------ the plan

    def plan(self, waiting: list[Req], running: list[Req]) -> StepPlan:
        """The next step. Requests it admits leave WAITING for PREFILLING (the caller drops
        them from its queue)."""
        batch = self._prefill_batch(waiting, running)
        if batch:
            all_logits = any(r.wants_prompt_logprobs for r, _ in batch)
            mixed = bool(running) and self.config.enable_mixed_chunk and not all_logits
            return prefill_plan(batch, running, mixed, all_logits)
        return decode_plan(running) if running else IDLE

    def reserved(self) -> None:
        """A prefill got its KV: admit whole batches again."""
        self.admit_one = False

    def prefilled(self, plan: StepPlan) -> None:
        """The plan's prompt chunks ran: a prompt that is not done goes on next step."""
        self.chunked = None
        self.last_was_chunk = False
        for req, end in zip(plan.prefill, plan.prefill_ends):
            if end < req.seq_len:
                self.chunked = req
                self.last_was_chunk = True

    def requeued(self) -> None:
        """A prefill could not reserve its KV and went back to the queue (memory estimates
        were off): until a prefill succeeds, one request at a time, never the same batch.
        A chunked prompt restarts from its cached prefix."""
        self.chunked = None
        self.admit_one = True

    def forget(self, req: Req) -> None:
        """`req` ended."""
        if req is self.chunked:
            self.chunked = None

    def decoded(self) -> None:
        """A decode step ran: expect a little less of the running requests."""
        self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)

    def retracted(self) -> None:
        """A running request had to make room: expect more of the others."""
        self.new_token_ratio = min(1.0, self.new_token_ratio + RETRACT_NEW_TOKEN_RATIO_STEP)

    # ------------------------------------------------------- prefill batch

    def _prefill_batch(self, waiting: list[Req], running: list[Req]) -> list[tuple[Req, int]]:
        """Requests to prefill now with the end position of each one's chunk."""
        if self.last_was_chunk and running and not self.config.enable_mixed_chunk:
            self.last_was_chunk = False
            return []  # a decode step between two chunks of a long prompt
        if not waiting and self.chunked is None:
            return []
        chunk_cap = self.config.chunked_prefill_size or self.context_len
        budget = self.config.max_prefill_tokens
        if self.chunked is not None:
            req = self.chunked
            cap = min(chunk_cap, LOGITS_TOKEN_BUDGET) if req.wants_prompt_logprobs else chunk_cap
            return [(req, min(req.seq_len, req.kv_len + min(cap, budget)))]
        reserved = sum(int(r.remaining_new_tokens * self.new_token_ratio) for r in running)
        room = self.kv.available() - reserved
        batch: list[tuple[Req, int]] = []
        all_logits = False  # a batch with prompt logprobs computes logits of every token
        order = order_waiting(waiting, self.config.policy, self.kv, self.config.max_skips)
        for req in order:
            if len(running) + len(batch) >= self.config.max_running_requests or budget <= 0:
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
            alone = not batch and not running
            if cost > room and not alone:
                break
            before = self.kv.available()
            if not self.kv.attach(req):
                break
            cost += before - self.kv.available()  # its prefix, now locked, can no longer be evicted
            if cost > room and not alone:
                self.kv.release(req)
                break
            self._admit(req)
            room -= cost
            budget -= end - req.kv_len
            batch.append((req, end))
            if end < fill or self.admit_one:
                break  # a chunked prompt goes alone at the end of its batch
        last = max((r.arrival for r, _ in batch), default=0)
        for req in waiting:
            if req.status is ReqStatus.WAITING and req.arrival < last:
                req.skipped += 1
        return batch

    def _admit(self, req: Req) -> None:
        req.status = ReqStatus.PREFILLING
        if not req.admitted:
            req.admitted = True
            self.stats.prompt_tokens += len(req.origin_ids)
            self.stats.cached_tokens += req.cached_tokens

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
