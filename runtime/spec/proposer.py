"""Speculative decoding: cheap guesses of a request's next tokens, verified in one forward.

A proposer guesses up to K tokens per request; the target model then runs one extend step over
[last token, guesses] and yields the logits after each of them. At every row the target picks
its own token exactly as plain decoding would (the argmax, or a sample whose noise comes from
the request's seed and position), and `verify` keeps the guesses while they equal those picks,
then the first pick that differs (or the pick after the last guess). Every step thus commits
between 1 and K + 1 tokens, each one the target's own choice:
- greedy outputs equal plain decoding token for token;
- a sampled guess d holds with probability p(d), which is Leviathan et al.'s acceptance rule
  for a point-mass proposal (both proposers guess one token), and the committed tokens follow
  the target distribution; seeded outputs even equal plain decoding's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from arbor.runtime.config import CacheArgs, ModelArgs, SpecArgs
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.sampling.sampler import Sampler, SamplingBatch
from arbor.runtime.scheduler.grammar_manager import GrammarManager
from arbor.runtime.scheduler.req import Req


class NgramProposer:
    """Guesses from the request's own tokens (prompt lookup, as vLLM's and SGLang's n-gram
    modes): the tokens that followed the latest earlier occurrence of its last n tokens,
    trying n from `max_match` down to `min_match`."""

    def __init__(self, num_tokens: int, min_match: int, max_match: int) -> None:
        self.k, self.min_match, self.max_match = num_tokens, min_match, max_match

    def propose(self, reqs: list[Req], budgets: list[int], grammar: GrammarManager | None = None) -> list[list[int]]:
        """Guesses for each request, at most its budget (the scheduler cuts them to grammars)."""
        return [self.guess(np.frombuffer(r.fill_ids(), dtype=np.int32), b) for r, b in zip(reqs, budgets)]

    def commit(self, req: Req, kept: int) -> None:
        """Nothing to keep in step: the guesses came from the request's own tokens."""

    def release(self, req: Req) -> None:
        """Nothing held per request."""

    def guess(self, tokens: np.ndarray, budget: int) -> list[int]:
        """Up to min(K, budget) guesses following `tokens` (int32), or none."""
        k = min(self.k, budget)
        if k <= 0:
            return []
        end = len(tokens)
        for n in range(min(self.max_match, end - 1), self.min_match - 1, -1):
            tail = tokens[end - n :]
            # Windows of n tokens starting at 0 .. end-n-1 (not the tail itself).
            windows = np.lib.stride_tricks.sliding_window_view(tokens[: end - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return tokens[start : start + k].tolist()
        return []


class Proposer(Protocol):
    """What the scheduler asks of a guesser."""

    def propose(self, reqs: list[Req], budgets: list[int], grammar: GrammarManager | None = None) -> list[list[int]]:
        """Up to budgets[i] guesses for each request; `grammar` steps constrained ones."""

    def commit(self, req: Req, kept: int) -> None:
        """After verification: the first `kept` guesses became output and keep their K/V."""

    def release(self, req: Req) -> None:
        """The request left the running batch; drop what is held for it."""


def make_proposer(spec: SpecArgs, model: ModelArgs, cache: CacheArgs, target: ModelRunner) -> Proposer | None:
    """The proposer `--speculative-algorithm` names, or None (speculation off). A draft
    checkpoint runs with the target's `model` and `cache` settings."""
    if spec.algorithm == "ngram":
        return NgramProposer(spec.num_draft_tokens, spec.ngram_min_match, spec.ngram_max_match)
    if spec.algorithm == "draft":
        from arbor.runtime.spec.draft import DraftProposer

        return DraftProposer(spec, model, cache, target)
    return None


@dataclass
class Verdict:
    """One request's verified step: tokens to commit, how many were accepted guesses, and the
    logits row each committed token was chosen from (for its logprob)."""

    tokens: list[int]
    accepted: int
    rows: list[int]


def verify(
    logits: torch.Tensor,
    offsets: Sequence[int],
    drafts: Sequence[Sequence[int]],
    sampling: SamplingBatch,
    sampler: Sampler,
) -> list[Verdict]:
    """Check each request's guesses against the target's logits. Request i owns rows
    offsets[i] .. offsets[i] + len(drafts[i]) of `logits` (row j: the distribution after its
    j-th input, so row 0 scores guess 1); `sampling` has one entry per row."""
    picks = sampler(logits, sampling).tolist()  # the target's own choice at every row
    verdicts = []
    for off, draft in zip(offsets, drafts):
        accepted = 0
        while accepted < len(draft) and draft[accepted] == picks[off + accepted]:
            accepted += 1
        rows = list(range(off, off + accepted + 1))
        verdicts.append(Verdict([picks[r] for r in rows], accepted, rows))
    return verdicts
