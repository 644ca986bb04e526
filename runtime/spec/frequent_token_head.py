"""A draft model's LM head over its frequent tokens only (FR-Spec, Zhao et al. 2025).

A small draft spends much of each forward on the 50k-row LM head. Most guesses come from a
few thousand tokens (on the evaluation pair, the 8,192 commonest training tokens cover 98.8%
of held-out text), so the head computes just those rows and gives every other token -inf.
Guesses only propose; the target verifies every one, so outputs are unchanged and only
acceptance can drop. A greedy pick reads the hot logits directly; only a grammar's mask needs
them spread over the whole vocabulary. The token map is SGLang's `--speculative-token-map`
format: a torch file holding a 1-D tensor of token ids.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from arbor.runtime.model.causal_lm import CausalLM
from arbor.runtime.model.layers import ParallelLMHead, TiedLMHead


class FrequentTokenHead(nn.Module):
    """Logits [N, hot tokens]: the hot rows of the full head's weight, in `hot`'s order (a
    greedy pick is `hot[argmax]`; `full_vocab` spreads them over the vocabulary)."""

    def __init__(self, weight: torch.Tensor, hot: torch.Tensor) -> None:
        super().__init__()
        self.hot = hot.to(device=weight.device, dtype=torch.int64)
        self.proj = nn.Linear(weight.shape[1], hot.numel(), bias=False, device=weight.device, dtype=weight.dtype)
        self.proj.weight.data.copy_(weight.detach()[self.hot])

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)


def full_vocab(logits: torch.Tensor, columns: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N, vocab] logits from a hot head's [N, len(columns)]: -inf for every other token."""
    out = logits.new_full((logits.shape[0], vocab), float("-inf"))
    return out.index_copy_(1, columns, logits)


def load_token_map(path: str | Path, vocab_size: int) -> torch.Tensor:
    """The token ids in `path` (a torch file with one 1-D integer tensor), checked and unique."""
    ids = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.is_floating_point() or ids.numel() == 0:
        raise ValueError(f"speculative token map {path}: expected a non-empty 1-D tensor of token ids")
    ids = torch.unique(ids.to(torch.int64))
    if int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"speculative token map {path}: token ids must lie in [0, {vocab_size})")
    return ids


def use_frequent_token_head(model: CausalLM, hot: torch.Tensor) -> torch.Tensor:
    """Give `model` a FrequentTokenHead in place of its LM head (tied or not; call before packing);
    returns the token id of each of its logits' columns."""
    dense = model.lm_head
    if not isinstance(dense, (ParallelLMHead, TiedLMHead)):
        raise ValueError(f"a frequent-token head replaces a dense LM head, not a {type(dense).__name__}")
    head = FrequentTokenHead(dense.weight, hot)
    model.lm_head = head
    return head.hot
