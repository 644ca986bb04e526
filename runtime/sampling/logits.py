"""From a forward's logits to what sampling and the caller need: per-row edits (penalties,
min-token stop blocking, grammar masks), sampling parameters, and logprobs."""

from __future__ import annotations

import torch

from arbor.runtime.sampling.penalties import apply_penalties, block_stop_tokens
from arbor.runtime.sampling.sampler import SamplingBatch
from arbor.runtime.scheduler.grammar_manager import GrammarManager
from arbor.runtime.scheduler.req import Req


def prepare_logits(
    reqs: list[Req],
    logits: torch.Tensor,
    eos_ids: list[int],
    grammar: GrammarManager | None,
    ahead: list[list[int]] | None = None,
) -> tuple[torch.Tensor, SamplingBatch]:
    """Apply penalties, min-token stop blocking and grammar masks to each row, and build its
    sampling parameters. Row i belongs to reqs[i] as if `ahead[i]` (guesses still being
    verified) had already been generated. The logits may be edited in place."""
    ahead = ahead or [[] for _ in reqs]
    params = [r.params for r in reqs]
    outputs = [r.output_ids + a if a else r.output_ids for r, a in zip(reqs, ahead)]
    if not all(p.greedy and not p.penalized for p in params) or any(r.return_logprob for r in reqs):
        logits = logits.float()  # probabilities and penalties in float32; an argmax needs neither
    if any(p.penalized for p in params):
        apply_penalties(logits, params, outputs)
    # Before min_new_tokens, no token that would stop the request may be picked (EOS does
    # not stop an ignore_eos request, so it stays allowed there, as in vLLM).
    early = [
        (i, r.params.stop_token_ids + ([] if r.params.ignore_eos else eos_ids))
        for i, (r, out) in enumerate(zip(reqs, outputs))
        if len(out) < r.params.min_new_tokens
    ]
    if early:
        block_stop_tokens(logits, [i for i, _ in early], [ids for _, ids in early])
    if grammar is not None:
        grammar.apply_masks(reqs, logits, ahead)
    sampling = SamplingBatch.build(params, [len(out) for out in outputs], logits.shape[-1], logits.device)
    return logits, sampling


def token_logprobs(
    reqs: list[Req], logits: torch.Tensor, rows: list[int], tokens: list[int]
) -> tuple[list[float], list[list]] | None:
    """Logprob of tokens[i] at logits row rows[i], and the top alternatives there (as many as
    any request asks), batched; None if no request returns logprobs."""
    if not any(r.return_logprob for r in reqs):
        return None
    lp = torch.log_softmax(logits[rows], -1)
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    k = max(r.top_logprobs_num for r in reqs)
    return chosen, top_logprobs(lp, k) if k else [[] for _ in rows]


def prompt_logprobs(reqs: list[Req], fills: list, ends: list[int], all_logits: torch.Tensor) -> None:
    """Append to each request the logprob of every prompt token of its chunk from
    `logprob_start` on, given the tokens before it (all_logits: every row of an extend)."""
    offset = 0
    for req, fill, end in zip(reqs, fills, ends):
        n = end - req.kv_len
        if req.wants_prompt_logprobs:
            # Row j predicts position kv_len + j + 1; keep targets in [max(start, 1), prompt end).
            first = max(req.logprob_start, 1, req.kv_len + 1)
            last = min(end + 1, len(req.origin_ids))
            if last > first:
                rows = all_logits[offset + first - 1 - req.kv_len : offset + last - 1 - req.kv_len]
                lp = torch.log_softmax(rows.float(), -1)
                targets = torch.tensor(fill[first:last].tolist(), device=lp.device)
                req.input_logprobs += lp.gather(1, targets[:, None])[:, 0].tolist()
                if req.top_logprobs_num:
                    req.input_top_logprobs += top_logprobs(lp, req.top_logprobs_num)
        offset += n


def top_logprobs(logprobs: torch.Tensor, k: int) -> list[list[tuple[float, int]]]:
    """The k most likely tokens of each row, as (logprob, token id), best first."""
    values, ids = logprobs.topk(k, dim=-1)
    return [list(zip(v, i)) for v, i in zip(values.tolist(), ids.tolist())]
