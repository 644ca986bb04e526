"""FR-Spec's restricted LM head: the hot tokens' logits exactly, -inf for the rest, and a
token map that is checked when it loads."""

from __future__ import annotations

import pytest
import torch

from arbor.runtime.model.loader import load_model
from arbor.runtime.spec.frequent_token_head import (
    FrequentTokenHead,
    full_vocab,
    load_token_map,
    use_frequent_token_head,
)


def test_frequent_token_head_matches_the_full_head_on_hot_tokens() -> None:
    torch.manual_seed(0)
    weight = torch.randn(50, 8)
    hot = torch.tensor([0, 7, 9, 31, 49])
    hidden = torch.randn(3, 8)
    out = FrequentTokenHead(weight, hot)(hidden)
    full = hidden @ weight.T
    assert out.shape == (3, 5)
    assert torch.allclose(out, full[:, hot], atol=1e-6)
    spread = full_vocab(out, hot, 50)
    assert spread.shape == (3, 50)
    assert torch.equal(spread[:, hot], out)
    cold = torch.ones(50, dtype=torch.bool)
    cold[hot] = False
    assert torch.isneginf(spread[:, cold]).all()
    # A greedy pick read from the hot columns is the full head's argmax over the hot tokens.
    assert torch.equal(hot[out.argmax(-1)], spread.argmax(-1))


def test_use_frequent_token_head_replaces_a_tied_head(tiny_model) -> None:
    model, _ = load_model(tiny_model("llama-tied-gqa4"), torch.float32, torch.device("cpu"))
    assert use_frequent_token_head(model, torch.tensor([3, 5])).tolist() == [3, 5]
    assert isinstance(model.lm_head, FrequentTokenHead)
    assert torch.equal(model.lm_head.proj.weight, model.embed_tokens.weight[[3, 5]])


def test_token_map_is_checked(tmp_path) -> None:
    good = tmp_path / "good.pt"
    torch.save(torch.tensor([5, 2, 2, 9]), good)
    assert load_token_map(good, 10).tolist() == [2, 5, 9]
    for name, value in {
        "range": torch.tensor([3, 10]),
        "float": torch.tensor([1.0]),
        "shape": torch.tensor([[1, 2]]),
        "empty": torch.tensor([], dtype=torch.int64),
    }.items():
        torch.save(value, tmp_path / f"{name}.pt")
        with pytest.raises(ValueError, match="token map"):
            load_token_map(tmp_path / f"{name}.pt", 10)
