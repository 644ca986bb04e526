"""The code in docs/contributing.md runs, and does what the page says: the prefix-cache
example passes every prefix-cache contract test; the weight-format example passes every
weight-source contract test and loads the tiny checkpoint into the model safetensors gives;
the model-architecture example (Gemma), registered as the page says, passes every CausalLM
contract test and gives transformers' logits."""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from arbor.runtime.config import CacheArgs, ModelArgs
from arbor.runtime.kv.pool import reserve_positions
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.loader import load_model
from arbor.runtime.model.registry import ARCHITECTURES
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.model.weights import WEIGHT_SOURCES
from tests.radix import test_prefix_cache_contract as contract
from tests.runtime import test_model_contract as model_contract
from tests.runtime import test_weight_source_contract as weight_contract

DOC = Path(__file__).resolve().parents[1] / "docs" / "contributing.md"


def _section_code(heading: str) -> str:
    text = DOC.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_prefix_cache_example_keeps_the_contract(page_size):
    namespace: dict[str, object] = {}
    exec(compile(_section_code("Add a prefix-cache implementation"), str(DOC), "exec"), namespace)
    make = namespace["CountingCache"]
    checks = [f for name, f in vars(contract).items() if name.startswith("test_") and callable(f)]
    assert len(checks) >= 10
    for check in checks:
        check(make(page_size))  # type: ignore[operator]
    cache = make(page_size)  # type: ignore[operator]
    cache.insert(list(range(8)), list(range(100, 108)))
    assert cache.evict(8, lambda slots: None) == 8 and cache.evicted_tokens == 8


def _weight_format_example(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The example's names, with NpzSource registered (as step 2 says) for this test only."""
    namespace: dict[str, object] = {}
    exec(compile(_section_code("Add a weight format"), str(DOC), "exec"), namespace)
    monkeypatch.setitem(WEIGHT_SOURCES, "npz", namespace["NpzSource"])
    return namespace


def test_the_weight_format_example_keeps_the_contract(monkeypatch, tmp_path):
    example = _weight_format_example(monkeypatch)
    source, write = example["NpzSource"], example["save_npz"]
    fmt = weight_contract.Format(source, write)  # type: ignore[arg-type]
    checks = [
        f
        for name, f in vars(weight_contract).items()
        if name.startswith("test_") and list(inspect.signature(f).parameters) == ["fmt", "tmp_path"]
    ]
    assert len(checks) >= 5
    for i, check in enumerate(checks):
        (tmp_path / str(i)).mkdir()
        check(fmt, tmp_path / str(i))


@pytest.mark.parametrize("load_format", ["npz", "auto"])
def test_the_weight_format_example_loads_the_model_safetensors_gives(monkeypatch, tmp_path, tiny_model, load_format):
    example = _weight_format_example(monkeypatch)
    example["convert_to_npz"](tiny_model("llama"), tmp_path / "npz")  # type: ignore[operator]
    cpu = torch.device("cpu")
    want, _ = load_model(tiny_model("llama"), torch.float32, cpu)
    got, _ = load_model(tmp_path / "npz", torch.float32, cpu, load_format=load_format)
    theirs = dict(want.named_parameters())
    assert [name for name, _ in got.named_parameters()] == list(theirs)
    assert all(torch.equal(p, theirs[name]) for name, p in got.named_parameters())


def _register_model_example(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The example as runtime/model/models/gemma.py, registered (as step 2 says) for this test only."""
    module = types.ModuleType("arbor.runtime.model.models.gemma")
    exec(compile(_section_code("Add a model architecture"), str(DOC), "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(ARCHITECTURES, "GemmaForCausalLM", ("gemma", "GemmaForCausalLM"))
    return module


def _tiny_gemma(path: Path) -> Path:
    """A random Gemma written by transformers: weights drawn wide enough that logits are not
    near zero, norm gains away from 1 so that a mis-loaded norm changes them."""
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = GemmaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.2 if "norm" in name else 0.05)
    model.save_pretrained(path)
    return path


def test_the_model_example_is_about_a_hundred_lines():
    assert 60 <= len(_section_code("Add a model architecture").splitlines()) <= 120


def test_the_model_example_keeps_the_contract(monkeypatch, tmp_path):
    _register_model_example(monkeypatch)
    path = _tiny_gemma(tmp_path / "gemma")
    checks = [
        f
        for name, f in vars(model_contract).items()
        if name.startswith("test_") and list(inspect.signature(f).parameters) == ["checkpoint"]
    ]
    assert len(checks) >= 5
    for check in checks:
        check(path)


def test_the_model_example_gives_transformers_logits(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM

    example = _register_model_example(monkeypatch)
    path = _tiny_gemma(tmp_path / "gemma")
    runner = ModelRunner(ModelArgs(dtype="float32"), CacheArgs(max_total_tokens=1024), 64, str(path))
    assert isinstance(runner.model, example.GemmaForCausalLM)
    prompts = [[5, 17, 99, 3, 250, 8, 8, 41], [7] * 3, list(range(30, 90))]
    rows = [runner.req_to_token.alloc() for _ in prompts]
    ends = [len(p) for p in prompts]
    loc = reserve_positions(runner.req_to_token, runner.allocator, rows, [0] * len(prompts), ends)
    batch = ForwardBatch.build(
        ForwardMode.EXTEND, prompts, [0] * len(prompts), rows, loc, runner.req_to_token.table, return_all_logits=True
    )
    ours = runner.forward(batch).all_logits
    assert ours is not None
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for prompt, got in zip(prompts, ours.split(ends)):
            want = hf(torch.tensor([prompt])).logits[0]
            assert want.abs().max() > 0.5  # not a comparison of near-zero logits
            assert (got - want).abs().max().item() < 1e-4
