"""The draft model of speculative decoding: a smaller checkpoint with its own paged KV and
radix tree, kept in step with the target's requests.

Each target request gets a shadow `Req` that shares its prompt and its output list, so the
draft's KVManager sees the same tokens. A proposal step feeds each shadow what it has not
seen yet (one extend: the prompt the draft tree misses, or the tokens committed since the last
step) and then decodes greedily, one batched step per guess. Guesses are the draft's argmax,
a point-mass proposal, so the target's rejection rule (`speculative.verify`) stays exact.
After verification the shadow keeps the K/V of the guesses that were committed and frees
the rest (`KVManager.truncate`); when the target releases a request, so does the draft.
"""

from __future__ import annotations

import dataclasses

import torch

from arbor.kernels.cpu_ops import argmax_cpu
from arbor.runtime.config import CacheArgs, ModelArgs, SpecArgs
from arbor.runtime.kv.manager import KVManager, make_prefix_cache
from arbor.runtime.model.forward_batch import ForwardMode
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.scheduler.batch import build_batch
from arbor.runtime.scheduler.grammar_manager import GrammarManager
from arbor.runtime.scheduler.req import Req
from arbor.runtime.spec.frequent_token_head import full_vocab, load_token_map


class DraftProposer:
    """Guesses from a draft checkpoint; `propose`, then `commit` or `release` per request."""

    def __init__(self, spec: SpecArgs, model: ModelArgs, cache: CacheArgs, target: ModelRunner) -> None:
        """The draft checkpoint of `spec` runs as the target does (`model`: dtype, device,
        kernels; `cache`: pages, KV dtype, prefix reuse)."""
        vocab = target.config.vocab_size
        hot = load_token_map(spec.token_map, vocab) if spec.token_map else None
        # As many KV slots and request rows as the target, so every running request fits in both.
        draft_cache = dataclasses.replace(cache, max_total_tokens=target.allocator.total_slots)
        rows = target.req_to_token.table.shape[0]
        self.runner = ModelRunner(model, draft_cache, rows, str(spec.draft_model_path), hot)
        if self.runner.config.vocab_size != vocab:
            raise ValueError(
                f"the draft's vocabulary ({self.runner.config.vocab_size}) differs from the "
                f"target's ({target.config.vocab_size}); they must share a tokenizer"
            )
        self.kv = KVManager(self.runner.allocator, self.runner.req_to_token, make_prefix_cache(cache))
        self.k = spec.num_draft_tokens
        self.shadows: dict[int, Req] = {}
        self.written: dict[int, int] = {}  # per shadow: guesses whose K/V the last proposal wrote

    def propose(self, reqs: list[Req], budgets: list[int], grammar: GrammarManager | None = None) -> list[list[int]]:
        """Up to min(K, budget) greedy guesses per request (none where the budget is 0, or for
        every request when the draft's KV cannot be reserved this step). A constrained
        request's guesses follow its grammar's masks."""
        wants = [min(self.k, b) for b in budgets]
        active = [i for i, (r, k) in enumerate(zip(reqs, wants)) if k > 0 and self._attached(r)]
        guesses: list[list[int]] = [[] for _ in reqs]
        if not active:
            return guesses
        first = self._catch_up([reqs[i] for i in active], grammar, [guesses[i] for i in active])
        if first is None:
            return guesses
        for i, tok in zip(active, first):
            guesses[i].append(tok)
        for step in range(1, max(wants[i] for i in active)):
            going = [i for i in active if wants[i] > step]
            picks = self._decode([reqs[i] for i in going], step, grammar, [guesses[i] for i in going])
            if picks is None:
                break
            for i, tok in zip(going, picks):
                guesses[i].append(tok)
        for i in active:
            shadow = self.shadows[id(reqs[i])]
            shadow.kv_len = shadow.seq_len  # guesses stay mapped until `commit` keeps or frees them
            self.written[id(shadow)] = len(guesses[i]) - 1  # the last guess was never fed
        return guesses

    def commit(self, req: Req, kept: int) -> None:
        """After verification: keep the K/V of guesses that became output, free the rest."""
        shadow = self.shadows.get(id(req))
        if shadow is None or shadow.row < 0:
            return
        shadow.kv_len += min(kept, self.written.pop(id(shadow), 0))
        self.kv.truncate(shadow, shadow.kv_len)

    def release(self, req: Req) -> None:
        """The target let go of the request (finished, retracted, put back): so does the draft."""
        shadow = self.shadows.pop(id(req), None)
        if shadow is None:
            return
        self.written.pop(id(shadow), None)
        if shadow.row >= 0:
            self.kv.release(shadow)

    # ------------------------------------------------------------------ steps

    def _shadow(self, req: Req) -> Req:
        shadow = self.shadows.get(id(req))
        if shadow is None:
            shadow = Req(req.rid, req.origin_ids, req.params, cache_salt=req.cache_salt)
            shadow.output_ids = req.output_ids  # the same list: committed tokens appear in both
            self.shadows[id(req)] = shadow
        return shadow

    def _attached(self, req: Req) -> bool:
        shadow = self._shadow(req)
        return shadow.row >= 0 or self.kv.attach(shadow)

    def _catch_up(self, reqs: list[Req], grammar: GrammarManager | None, ahead: list[list[int]]) -> list[int] | None:
        """Feed each request's shadow the tokens it has not seen; returns the first guesses
        (None if the KV cannot be reserved). Guesses of a step that was never verified (the
        target decoded plainly) are dropped."""
        shadows = [self.shadows[id(r)] for r in reqs]
        for s in shadows:
            self.kv.truncate(s, s.kv_len)
        ends = [s.seq_len for s in shadows]
        inputs = [s.fill_ids()[s.kv_len :].tolist() for s in shadows]
        fb = build_batch(self.kv, ForwardMode.EXTEND, shadows, ends, inputs)
        if fb is None:
            return None
        picks = self._picks(self.runner.forward(fb).next_token_logits, reqs, grammar, ahead)
        for s, e in zip(shadows, ends):
            s.kv_len = e
            self.kv.cache_prefix(s)  # later requests with this prompt hit the draft's tree too
        return picks

    def _decode(
        self, reqs: list[Req], step: int, grammar: GrammarManager | None, ahead: list[list[int]]
    ) -> list[int] | None:
        """One batched decode step over each request's last guess (`ahead[i][-1]`, position
        seq_len + step - 1); returns the next guesses (None if the KV cannot be reserved)."""
        shadows = [self.shadows[id(r)] for r in reqs]
        starts = [s.seq_len + step - 1 for s in shadows]
        for s, p in zip(shadows, starts):
            s.kv_len = p
        fb = build_batch(self.kv, ForwardMode.DECODE, shadows, [p + 1 for p in starts], [[a[-1]] for a in ahead])
        if fb is None:
            return None
        return self._picks(self.runner.forward(fb).next_token_logits, reqs, grammar, ahead)

    def _picks(
        self, logits: torch.Tensor, reqs: list[Req], grammar: GrammarManager | None, ahead: list[list[int]]
    ) -> list[int]:
        """The draft's argmax per row, masked for constrained requests by the grammar state
        after their output and their guesses so far (a hot head's columns are spread over the
        vocabulary for the masks only)."""
        columns = self.runner.columns
        if grammar is not None and any(r.matcher is not None for r in reqs):
            if columns is not None:
                logits, columns = full_vocab(logits, columns, self.runner.config.vocab_size), None
            grammar.apply_masks(reqs, logits, ahead)
        picks = argmax_cpu(logits)
        return (picks if columns is None else columns[picks]).tolist()
