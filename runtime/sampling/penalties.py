"""Logit adjustments that depend on what a request generated: repetition penalties, min_new_tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arbor.runtime.sampling.params import SamplingParams


def apply_penalties(logits: torch.Tensor, params: Sequence[SamplingParams], outputs: Sequence[Sequence[int]]) -> None:
    """In place, per row: OpenAI frequency/presence penalties and the CTRL repetition
    penalty over the tokens generated so far."""
    for row, (p, out) in enumerate(zip(params, outputs)):
        if not p.penalized or not out:
            continue
        ids = torch.tensor(out, device=logits.device)
        counts = torch.zeros(logits.shape[1], device=logits.device).index_add_(
            0, ids, torch.ones(len(out), device=logits.device)
        )
        seen = counts > 0
        x = logits[row]
        x -= p.frequency_penalty * counts + p.presence_penalty * seen.float()
        if p.repetition_penalty != 1:
            r = p.repetition_penalty
            x[seen] = torch.where(x[seen] > 0, x[seen] / r, x[seen] * r)


def block_stop_tokens(logits: torch.Tensor, rows: Sequence[int], stop_ids: Sequence[Sequence[int]]) -> None:
    """In place: rows that have not reached min_new_tokens cannot pick a stop token."""
    pairs = [(row, tok) for row, ids in zip(rows, stop_ids) for tok in ids]
    if pairs:
        index = torch.tensor(pairs, device=logits.device)
        logits[index[:, 0], index[:, 1]] = float("-inf")
