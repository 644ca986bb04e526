"""Every registered architecture keeps the CausalLM contract (runtime/model/causal_lm.py): it
is a CausalLM whose parameters all load through WeightLayers; its checkpoint loads on one rank
and on each of two, the two ranks' parts tiling every tensor; the quantizer's view of each
linear layer covers its rows with checkpoint tensors; a tensor missing or extra is refused by
name; and a forward pass gives full-vocabulary logits.

Each test takes a checkpoint directory, so tests/test_contributing.py runs them on the
documented example architecture too."""

from __future__ import annotations

import inspect
import itertools
from pathlib import Path

import pytest
import torch

from arbor.runtime.config import CacheArgs, ModelArgs
from arbor.runtime.kv.pool import reserve_positions
from arbor.runtime.model.causal_lm import CausalLM
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.layers import LinearLayer, WeightLayer
from arbor.runtime.model.loader import load_model
from arbor.runtime.model.model_config import CheckpointError, ModelConfig
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.model.registry import ARCHITECTURES, model_class
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.model.weights import open_weights

# A tiny checkpoint (tests/conftest.py) for every registered architecture.
CHECKPOINTS = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
CPU = torch.device("cpu")


@pytest.fixture(params=sorted(CHECKPOINTS))
def checkpoint(request: pytest.FixtureRequest, tiny_model) -> Path:
    return tiny_model(CHECKPOINTS[request.param])


def test_every_registered_architecture_has_a_checkpoint_here() -> None:
    assert set(ARCHITECTURES) == set(CHECKPOINTS)


def _meta_model(path: Path, tp: TensorParallel = SINGLE) -> CausalLM:
    cfg = ModelConfig.from_dir(path)
    with torch.device("meta"):
        return model_class(cfg.architecture)(cfg, tp)


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return dict(open_weights(path).tensors(CPU))


def test_is_a_causal_lm(checkpoint: Path) -> None:
    cls = model_class(ModelConfig.from_dir(checkpoint).architecture)
    assert issubclass(cls, CausalLM) and not inspect.isabstract(cls)


def test_every_parameter_loads_through_a_weight_layer(checkpoint: Path) -> None:
    model = _meta_model(checkpoint)
    layers = set(model.weight_layers().values())
    owned = sum(p.numel() for layer in layers for p in layer.parameters(recurse=False))
    assert owned == sum(p.numel() for p in model.parameters()) > 0
    assert all(isinstance(layer, WeightLayer) for layer in layers)


def test_loads_on_one_rank_and_two_ranks_tile_every_tensor(checkpoint: Path) -> None:
    load_model(checkpoint, torch.float32, CPU)
    ranks = [_meta_model(checkpoint, TensorParallel(r, 2)) for r in range(2)]
    for name, tensor in _tensors(checkpoint).items():
        parts = [rank.shard(name) for rank in ranks]
        if parts[0] is None:
            assert parts[1] is None, name  # norms: every rank holds all of it
            continue
        assert parts[1] is not None and parts[0][0] == parts[1][0], name
        dim, size = parts[0][0], tensor.shape[parts[0][0]]
        covered = sorted({(lo, hi) for _, lo, hi in parts if lo < hi})
        # consecutive, or one range on both ranks (a KV head replicated where heads < ranks)
        assert covered[0][0] == 0 and covered[-1][1] == size, (name, dim, covered)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(covered)), (name, covered)
    for rank in range(2):
        load_model(checkpoint, torch.float32, CPU, TensorParallel(rank, 2))


def test_linear_parts_cover_every_linear_layer(checkpoint: Path) -> None:
    model = _meta_model(checkpoint)
    names = {name.removesuffix(".weight") for name in _tensors(checkpoint)}
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, LinearLayer)]
    assert linears
    for name, layer in linears:
        parts = model.linear_parts(name)
        assert [lo for _, lo, _ in parts] == [sum(rows for _, _, rows in parts[:i]) for i in range(len(parts))]
        assert sum(rows for _, _, rows in parts) == layer.out_features, name
        tied = name == "lm_head" and "lm_head" not in names
        assert tied or {hf for hf, _, _ in parts} <= names, (name, parts)


def test_a_missing_or_unknown_tensor_is_refused_by_name(checkpoint: Path) -> None:
    tensors = _tensors(checkpoint)
    dropped = next(name for name in tensors if "k_proj.weight" in name)
    model = _meta_model(checkpoint).to_empty(device=CPU)
    with pytest.raises(CheckpointError, match=r"lacks weights for layers\.0\.self_attn"):
        model.load_weights((n, t) for n, t in tensors.items() if n != dropped)
    extra = {**tensors, "model.layers.0.mlp.extra_proj.weight": torch.zeros(2, 2)}
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.mlp\.extra_proj\.weight' has no place"):
        _meta_model(checkpoint).to_empty(device=CPU).load_weights(extra.items())


def test_forward_gives_full_vocabulary_logits(checkpoint: Path) -> None:
    runner = ModelRunner(ModelArgs(dtype="float32"), CacheArgs(max_total_tokens=256), 64, str(checkpoint))
    prompt = [5, 17, 99, 3, 250]
    rows = [runner.req_to_token.alloc()]
    loc = reserve_positions(runner.req_to_token, runner.allocator, rows, [0], [len(prompt)])
    batch = ForwardBatch.build(
        ForwardMode.EXTEND, [prompt], [0], rows, loc, runner.req_to_token.table, return_all_logits=True
    )
    out = runner.forward(batch)
    assert out.all_logits is not None
    assert out.all_logits.shape == (len(prompt), runner.config.vocab_size)
    assert torch.isfinite(out.all_logits).all() and out.all_logits.abs().max() > 0.1
