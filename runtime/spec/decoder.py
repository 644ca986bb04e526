"""A speculative decode step: guesses from the proposer, one verify forward, commit and rollback.

Part of the Scheduler (a mixin over its running batch, KV manager, grammar and sampler); the
proposers and the acceptance rule are in `speculative.py`.
"""

from __future__ import annotations

import numpy as np
import torch

from arbor.runtime.io.messages import ReqOut
from arbor.runtime.kv.manager import KVManager
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.sampling.logits import prepare_logits, token_logprobs
from arbor.runtime.sampling.sampler import Sampler
from arbor.runtime.scheduler.grammar_manager import GrammarManager
from arbor.runtime.scheduler.req import Req
from arbor.runtime.spec.proposer import Proposer, verify


class SpeculativeStep:
    """The Scheduler's decode step with guesses (it commits through the Scheduler's
    `_commit` and `_emit`, as a plain decode step does)."""

    runner: ModelRunner
    kv: KVManager
    grammar: GrammarManager | None
    sampler: Sampler
    eos_ids: list[int]
    proposer: Proposer | None
    running: list[Req]
    counters: dict[str, float]

    def _run_speculative(self) -> list[ReqOut] | None:
        """A decode step that also verifies each request's guesses; None (a plain decode step
        runs instead) when nobody has a guess or the guesses' KV cannot be reserved.
        A constrained request's guesses are cut where its grammar stops accepting them."""
        reqs = list(self.running)
        room = self.runner.context_len - 1
        budgets = [min(r.remaining_new_tokens, room - r.seq_len + 1) - 1 for r in reqs]
        drafts = self.proposer.propose(reqs, budgets, self.grammar)
        if self.grammar is not None:
            drafts = [self.grammar.valid_prefix(r, d) if r.matcher is not None else d for r, d in zip(reqs, drafts)]
        if not any(drafts):
            return None
        ends = [r.seq_len + len(d) for r, d in zip(reqs, drafts)]
        loc = self.kv.reserve(reqs, ends)
        if loc is None:
            return None
        inputs = [r.fill_ids()[r.kv_len :].tolist() + d for r, d in zip(reqs, drafts)]
        fb = ForwardBatch.build(ForwardMode.EXTEND, inputs, [r.kv_len for r in reqs], [r.row for r in reqs], loc,
                                self.runner.req_to_token.table, return_all_logits=True)
        logits = self.runner.forward(fb).all_logits
        # Each request's last len(draft) + 1 rows: the distributions after its last token and guesses.
        ends_at = np.cumsum([len(x) for x in inputs])
        rows = [int(e) - len(d) - 1 + j for e, d in zip(ends_at, drafts) for j in range(len(d) + 1)]
        return self._finish_speculative(reqs, drafts, logits[rows])

    def _finish_speculative(self, reqs: list[Req], drafts: list[list[int]], logits: torch.Tensor) -> list[ReqOut]:
        """Verify the guesses, commit what holds (stopping at a finish or a jump-forward),
        roll back the rest."""
        row_reqs = [r for r, d in zip(reqs, drafts) for _ in range(len(d) + 1)]
        ahead = [d[:j] for d in drafts for j in range(len(d) + 1)]
        logits, sampling = prepare_logits(row_reqs, logits, self.eos_ids, self.grammar, ahead)
        offsets = np.cumsum([0] + [len(d) + 1 for d in drafts[:-1]]).tolist()
        verdicts = verify(logits, offsets, drafts, sampling, self.sampler)
        picked = [(row, tok) for v in verdicts for row, tok in zip(v.rows, v.tokens)]
        lps = token_logprobs(reqs, logits, [r for r, _ in picked], [t for _, t in picked])
        self._count_decode_step()
        self.counters["spec_verify_steps"] += 1
        outs, first = [], 0  # first: the request's first entry in `picked`
        for req, draft, v in zip(reqs, drafts, verdicts):
            pending = req.seq_len - req.kv_len  # forwarded this step before the guesses
            committed, jumped = 0, False
            for j, tok in enumerate(v.tokens):
                jumped = self._commit(req, tok, lps, first + j)
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
                self.counters["spec_request_steps"] += 1
                self.counters["spec_draft_tokens"] += len(draft)
                self.counters["spec_accepted_tokens"] += kept
            self.counters["generated_tokens"] += committed
            first += len(v.tokens)
            self._emit(req, outs)
        self.running = [r for r in self.running if r.finish_reason is None]
        return outs
