"""The code in docs/contributing.md runs, and does what the page says: the prefix-cache
example passes every prefix-cache contract test; the weight-format example passes every
weight-source contract test and loads the tiny checkpoint into the model safetensors gives."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch

from arbor.runtime.model.loader import load_model
from arbor.runtime.model.weights import WEIGHT_SOURCES
from tests.radix import test_prefix_cache_contract as contract
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
    checks = [f for name, f in vars(weight_contract).items() if name.startswith("test_")
              and list(inspect.signature(f).parameters) == ["fmt", "tmp_path"]]
    assert len(checks) >= 5
    for i, check in enumerate(checks):
        (tmp_path / str(i)).mkdir()
        check(fmt, tmp_path / str(i))


@pytest.mark.parametrize("load_format", ["npz", "auto"])
def test_the_weight_format_example_loads_the_model_safetensors_gives(
    monkeypatch, tmp_path, tiny_model, load_format
):
    example = _weight_format_example(monkeypatch)
    example["convert_to_npz"](tiny_model("llama"), tmp_path / "npz")  # type: ignore[operator]
    cpu = torch.device("cpu")
    want, _ = load_model(tiny_model("llama"), torch.float32, cpu)
    got, _ = load_model(tmp_path / "npz", torch.float32, cpu, load_format=load_format)
    theirs = dict(want.named_parameters())
    assert [name for name, _ in got.named_parameters()] == list(theirs)
    assert all(torch.equal(p, theirs[name]) for name, p in got.named_parameters())
