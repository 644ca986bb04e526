"""SpecDecoder: a decode step with guesses. Propose, verify in one forward, commit what holds
and roll back the rest.

The Scheduler holds one when speculation is on and tries it before each plain decode step.
It commits tokens through the `TokenSink` it is given (the Scheduler's own commit and emit, so
a committed guess is handled exactly as a sampled token); the proposers and the acceptance rule
are in `proposer.py`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from arbor.runtime.io.messages import ReqOut
from arbor.runtime.kv.manager import KVManager
from arbor.runtime.model.forward_batch import ForwardMode
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.sampling.logits import prepare_logits, token_logprobs
from arbor.runtime.sampling.sampler import Sampler
from arbor.runtime.scheduler.batch import build_batch
from arbor.runtime.scheduler.grammar_manager import GrammarManager
from arbor.runtime.scheduler.req import Req
from arbor.runtime.scheduler.stats import SchedulerStats
from arbor.runtime.spec.proposer import Proposer, verify

TokenLogprobs = tuple[list[float], list[list[tuple[float, int]]]]  # token_logprobs' answer: chosen, top


class TokenSink(Protocol):
    """Where a decode step's chosen tokens go (the Scheduler)."""

    def commit(self, req: Req, tok: int, lps: TokenLogprobs | None, i: int) -> bool:
        """Append `tok` (entry i of `lps`), set the finish reason, step the grammar; True if
        a jump-forward rewrote the output."""
        ...

    def emit(self, req: Req, outs: list[ReqOut]) -> None:
        """After a step: append the request's output to `outs` if it ended or streams."""
        ...

    def count_decode_step(self) -> None:
        """Count one decode step of the running batch."""
        ...


class SpecDecoder:
    """Proposer, verify forward and commit, over the target's runner and KV."""

    def __init__(
        self,
        proposer: Proposer,
        runner: ModelRunner,
        kv: KVManager,
        sampler: Sampler,
        eos_ids: list[int],
        max_batch: int,
        stats: SchedulerStats,
        sink: TokenSink,
    ) -> None:
        self.proposer = proposer
        self.runner = runner
        self.kv = kv
        self.sampler = sampler
        self.eos_ids = eos_ids
        self.max_batch = max_batch  # past this many running requests, decode plainly
        self.stats = stats
        self.sink = sink

    def step(self, running: list[Req], grammar: GrammarManager | None) -> list[ReqOut] | None:
        """A decode step that also verifies each request's guesses; None (a plain decode step
        runs instead) when the batch is too large, nobody has a guess or the guesses' KV cannot
        be reserved. A constrained request's guesses are cut where its grammar stops accepting
        them. The caller drops the requests that finished from its running list."""
        if len(running) > self.max_batch:
            return None
        reqs = list(running)
        room = self.runner.context_len - 1
        budgets = [min(r.remaining_new_tokens, room - r.seq_len + 1) - 1 for r in reqs]
        drafts = self.proposer.propose(reqs, budgets, grammar)
        if grammar is not None:
            drafts = [grammar.valid_prefix(r, d) if r.matcher is not None else d for r, d in zip(reqs, drafts)]
        if not any(drafts):
            return None
        ends = [r.seq_len + len(d) for r, d in zip(reqs, drafts)]
        inputs = [r.fill_ids()[r.kv_len :].tolist() + d for r, d in zip(reqs, drafts)]
        fb = build_batch(self.kv, ForwardMode.EXTEND, reqs, ends, inputs, all_logits=True)
        if fb is None:
            return None
        logits = self.runner.forward(fb).all_logits
        assert logits is not None, "a verify step returns the logits of every position"
        # Each request's last len(draft) + 1 rows: the distributions after its last token and guesses.
        ends_at = np.cumsum([len(x) for x in inputs])
        rows = [int(e) - len(d) - 1 + j for e, d in zip(ends_at, drafts) for j in range(len(d) + 1)]
        return self._commit(reqs, drafts, logits[rows], grammar)

    def release(self, req: Req) -> None:
        """The request left the running batch: drop what the proposer holds for it."""
        self.proposer.release(req)

    def _commit(
        self, reqs: list[Req], drafts: list[list[int]], logits: torch.Tensor, grammar: GrammarManager | None
    ) -> list[ReqOut]:
        """Verify the guesses, commit what holds (stopping at a finish or a jump-forward),
        roll back the rest."""
        row_reqs = [r for r, d in zip(reqs, drafts) for _ in range(len(d) + 1)]
        ahead = [d[:j] for d in drafts for j in range(len(d) + 1)]
        logits, sampling = prepare_logits(row_reqs, logits, self.eos_ids, grammar, ahead)
        offsets = np.cumsum([0] + [len(d) + 1 for d in drafts[:-1]]).tolist()
        verdicts = verify(logits, offsets, drafts, sampling, self.sampler)
        picked = [(row, tok) for v in verdicts for row, tok in zip(v.rows, v.tokens)]
        lps = token_logprobs(reqs, logits, [r for r, _ in picked], [t for _, t in picked])
        self.sink.count_decode_step()
        self.stats.spec_verify_steps += 1
        outs: list[ReqOut] = []
        first = 0  # the request's first entry in `picked`
        for req, draft, v in zip(reqs, drafts, verdicts):
            pending = req.seq_len - req.kv_len  # forwarded this step before the guesses
            committed, jumped = 0, False
            for j, tok in enumerate(v.tokens):
                jumped = self.sink.commit(req, tok, lps, first + j)
                committed += 1
                if req.finish_reason is not None or jumped:
                    break  # after a jump-forward rewrote the output, the later guesses are moot
            # Output token i (1-based) is guess i while i <= accepted, and its K/V stands
            # unless a jump-forward rewrote that token.
            kept = min(v.accepted, committed - jumped)
            req.kv_len += pending + kept
            self.kv.truncate(req, req.kv_len)
            self.proposer.commit(req, kept)
            if draft:
                req.spec_verify_ct += 1
                self.stats.spec_request_steps += 1
                self.stats.spec_draft_tokens += len(draft)
                self.stats.spec_accepted_tokens += kept
            self.stats.generated_tokens += committed
            first += len(v.tokens)
            self.sink.emit(req, outs)
        return outs
