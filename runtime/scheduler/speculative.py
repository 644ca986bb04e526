"""Speculative decoding: cheap guesses of a request's next tokens, verified in one forward.

A proposer guesses up to K tokens per request; the target model then runs one extend step over
[last token, guesses] and yields the logits after each of them. `verify` keeps the longest run
of guesses the target agrees with, plus one token of the target's own, so every step commits
between 1 and K + 1 tokens:
- greedy rows accept a guess exactly when it is the argmax, so outputs equal plain decoding;
- sampled rows accept guess d with probability p(d) and, on a rejection, draw from p with d
  removed (renormalised). With a point-mass proposal this is Leviathan et al.'s rejection
  rule, so every committed token follows the target distribution p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from arbor.runtime.config import ServerArgs
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.model.sampler import Sampler, SamplingBatch
from arbor.runtime.scheduler.req import Req


class NgramProposer:
    """Guesses from the request's own tokens (prompt lookup, as vLLM's and SGLang's n-gram
    modes): the tokens that followed the latest earlier occurrence of its last n tokens,
    trying n from `max_match` down to `min_match`."""

    def __init__(self, num_tokens: int, min_match: int, max_match: int) -> None:
        self.k, self.min_match, self.max_match = num_tokens, min_match, max_match

    def propose(self, reqs: list[Req], budgets: list[int]) -> list[list[int]]:
        """Guesses for each request, at most its budget."""
        return [self.guess(np.frombuffer(r.fill_ids(), dtype=np.int32), b) for r, b in zip(reqs, budgets)]

    def commit(self, req: Req, accepted: int, committed: int, guessed: int) -> None:
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

    def propose(self, reqs: list[Req], budgets: list[int]) -> list[list[int]]: ...
    def commit(self, req: Req, accepted: int, committed: int, guessed: int) -> None: ...
    def release(self, req: Req) -> None: ...


def make_proposer(args: ServerArgs, target: ModelRunner) -> Proposer | None:
    """The proposer `--speculative-algorithm` names, or None (speculation off)."""
    if args.speculative_algorithm == "ngram":
        return NgramProposer(args.speculative_num_draft_tokens, args.speculative_ngram_min_match,
                             args.speculative_ngram_max_match)
    if args.speculative_algorithm == "draft":
        from arbor.runtime.scheduler.draft import DraftProposer

        return DraftProposer(args, target)
    return None


@dataclass
class Verdict:
    """One request's verified step: tokens to commit, how many were accepted guesses, and the
    logits row each committed token was chosen from (for its logprob)."""

    tokens: list[int]
    accepted: int
    rows: list[int]


def verify(logits: torch.Tensor, offsets: Sequence[int], drafts: Sequence[Sequence[int]],
           sampling: SamplingBatch, sampler: Sampler) -> list[Verdict]:
    """Check each request's guesses against the target's logits. Request i owns rows
    offsets[i] .. offsets[i] + len(drafts[i]) of `logits` (row j: the distribution after its
    j-th input, so row 0 scores guess 1); `sampling` has one entry per row."""
    picks = sampler(logits, sampling).tolist()  # the target's own choice at every row
    probs = None if sampling.all_greedy else sampler.probs(logits, sampling)
    uniform = None if sampling.all_greedy else sampler.uniform(sampling).tolist()
    verdicts = []
    for off, draft in zip(offsets, drafts):
        tokens, rows = [], []
        for j, guess in enumerate(draft):
            row = off + j
            rows.append(row)
            if sampling.all_greedy or bool(sampling.greedy[row]):
                if guess != picks[row]:
                    tokens.append(picks[row])  # the argmax instead
                    break
            elif uniform[row] >= float(probs[row, guess]):
                tokens.append(sampler.sample_without(probs[row], guess, sampling, row))
                break
            tokens.append(guess)
        else:  # every guess held: the target adds the token after them
            rows.append(off + len(draft))
            tokens.append(picks[off + len(draft)])
        accepted = len(tokens) - 1
        verdicts.append(Verdict(tokens, accepted, rows))
    return verdicts
