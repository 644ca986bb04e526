"""Token sampling for a batch: greedy, temperature, top-k, top-p, min-p, per-request seeds.

Sampling draws argmax(p / E) with E ~ Exponential(1) per token, which picks token i with
probability p_i; the noise of a seeded request comes from (seed, step) alone, so its output
does not depend on what else is in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arbor.kernels.cpu_ops import argmax_cpu
from arbor.runtime.sampling.params import SamplingParams


@dataclass
class SamplingBatch:
    """Per-row sampling settings as tensors, built once per step."""

    temperature: torch.Tensor  # [B, 1]; 1 where greedy (unused there)
    top_k: torch.Tensor  # [B, 1]; vocab size where disabled
    top_p: torch.Tensor  # [B, 1]
    min_p: torch.Tensor  # [B, 1]
    greedy: torch.Tensor  # [B] bool
    seeds: list[int | None]
    steps: list[int]
    all_greedy: bool
    needs_filter: bool

    @classmethod
    def build(
        cls, params: Sequence[SamplingParams], steps: Sequence[int], vocab: int, device: torch.device
    ) -> SamplingBatch:
        def col(values: Sequence[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)[:, None]

        greedy = [p.greedy for p in params]
        if all(greedy):  # the sampler only takes the argmax: build no tensors
            none = torch.empty(0, device=device)
            return cls(none, none, none, none, none, [], [], all_greedy=True, needs_filter=False)
        top_k = [p.top_k if p.top_k > 0 else vocab for p in params]
        return cls(
            temperature=col([1.0 if g else p.temperature for p, g in zip(params, greedy)]),
            top_k=col(top_k, torch.int64),
            top_p=col([p.top_p for p in params]),
            min_p=col([p.min_p for p in params]),
            greedy=torch.tensor(greedy, device=device),
            seeds=[p.seed for p in params],
            steps=list(steps),
            all_greedy=all(greedy),
            needs_filter=any(
                not g and (k < vocab or p.top_p < 1 or p.min_p > 0) for p, g, k in zip(params, greedy, top_k)
            ),
        )


class Sampler:
    """Picks the next token of every row of a logits batch."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """logits [B, V] (float32 unless all rows are greedy) -> token ids [B] int64."""
        greedy_ids = argmax_cpu(logits)  # first maximum, like argmax; a C++ scan on CPU, else max()
        if batch.all_greedy:
            return greedy_ids
        probs = self.probs(logits, batch)
        sampled = (probs / self._exponential_noise(probs.shape, batch)).argmax(-1)
        return torch.where(batch.greedy, greedy_ids, sampled)

    def probs(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The distribution each sampled row draws from: softmax at its temperature, then its
        top-k / top-p / min-p filters [B, V]."""
        probs = torch.softmax(logits / batch.temperature, dim=-1)
        return _filter(probs, batch) if batch.needs_filter else probs

    def _exponential_noise(self, shape: torch.Size, batch: SamplingBatch) -> torch.Tensor:
        return -torch.log(self._uniform(shape, batch).clamp_min_(1e-20))

    def _uniform(self, shape: torch.Size, batch: SamplingBatch) -> torch.Tensor:
        device = self.generator.device
        u = torch.rand(shape, generator=self.generator, device=device)
        for row, (seed, step) in enumerate(zip(batch.seeds, batch.steps)):
            if seed is not None:
                g = torch.Generator(device=device).manual_seed(_mix(seed, step))
                u[row] = torch.rand(shape[1], generator=g, device=device)
        return u


def _filter(probs: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Zero the tokens outside each row's top-k, top-p nucleus and min-p floor."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[1], device=probs.device)[None, :]
    keep = rank < batch.top_k
    keep &= (sorted_p.cumsum(-1) - sorted_p) < batch.top_p  # the top token always stays
    keep &= sorted_p >= batch.min_p * sorted_p[:, :1]
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)


def _mix(seed: int, step: int) -> int:
    """A 63-bit generator seed from (request seed, output position)."""
    return (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9) % (2**63 - 1)
