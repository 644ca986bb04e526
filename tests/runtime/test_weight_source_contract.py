"""Every WeightSource keeps the contract its base class documents, and --load-format picks
the source: auto by what the path holds, a named format or a clear error otherwise."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.weights import WEIGHT_SOURCES, WeightSource, cut, open_weights
from arbor.runtime.tiny_model import TinySpec, make_tiny_model

CPU = torch.device("cpu")


class Format(NamedTuple):
    """A source and a writer of checkpoints it reads: write(directory, tensors)."""

    source: type[WeightSource]
    write: Callable[[Path, dict[str, torch.Tensor]], None]


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, path / "model.safetensors")


FORMATS = {"safetensors": Format(WEIGHT_SOURCES["safetensors"], _write_safetensors)}
TENSORS = {
    "model.embed_tokens.weight": torch.arange(48, dtype=torch.float32).reshape(12, 4),
    "model.layers.0.self_attn.o_proj.weight": torch.arange(24, dtype=torch.float16).reshape(4, 6),
    "model.norm.weight": torch.ones(4),
}
PARTS = {  # rows of one tensor, columns of another
    "model.embed_tokens.weight": (0, 3, 9),
    "model.layers.0.self_attn.o_proj.weight": (1, 2, 4),
}


@pytest.fixture(params=list(FORMATS))
def fmt(request: pytest.FixtureRequest) -> Format:
    return FORMATS[request.param]


def _written(fmt: Format, path: Path) -> WeightSource:
    path.mkdir(parents=True, exist_ok=True)
    fmt.write(path, TENSORS)
    return fmt.source(path)


def test_every_registered_format_is_tested():
    assert set(FORMATS) == set(WEIGHT_SOURCES)


def test_yields_every_tensor_once_by_name_in_its_dtype(fmt: Format, tmp_path: Path):
    read = list(_written(fmt, tmp_path).tensors(CPU))
    assert sorted(name for name, _ in read) == sorted(TENSORS)
    for name, tensor in read:
        assert tensor.dtype == TENSORS[name].dtype and torch.equal(tensor, TENSORS[name])


def test_a_shard_yields_only_its_part(fmt: Format, tmp_path: Path):
    read = dict(_written(fmt, tmp_path).tensors(CPU, PARTS.get))
    for name, whole in TENSORS.items():
        assert torch.equal(read[name], cut(whole, PARTS.get(name)))


def test_holds_only_a_path_with_its_files(fmt: Format, tmp_path: Path):
    _written(fmt, tmp_path / "full")
    (tmp_path / "empty").mkdir()
    assert fmt.source.holds(tmp_path / "full") and not fmt.source.holds(tmp_path / "empty")


def test_opening_a_path_without_its_files_says_what_it_expects(fmt: Format, tmp_path: Path):
    with pytest.raises(CheckpointError, match=re.escape(fmt.source.expects)):
        fmt.source(tmp_path)


def test_auto_picks_the_format_the_path_holds(fmt: Format, tmp_path: Path):
    _written(fmt, tmp_path)
    assert type(open_weights(tmp_path)) is fmt.source


def test_auto_without_weights_names_every_format(tmp_path: Path):
    expected = " or ".join(source.expects for source in WEIGHT_SOURCES.values())
    with pytest.raises(CheckpointError, match=re.escape(f"has no {expected}")):
        open_weights(tmp_path)


def test_an_unknown_format_lists_the_known_ones(tmp_path: Path):
    with pytest.raises(CheckpointError, match="choose auto or safetensors"):
        open_weights(tmp_path, "pickle")


def test_safetensors_shards_of_an_index_read_as_one_checkpoint(tmp_path: Path):
    make_tiny_model(tmp_path / "one", TinySpec(arch="llama"))
    make_tiny_model(tmp_path / "split", TinySpec(arch="llama"), max_shard_bytes=200_000)
    split = open_weights(tmp_path / "split", "safetensors")
    assert len(split.files) > 1  # type: ignore[attr-defined]
    whole = dict(open_weights(tmp_path / "one").tensors(CPU))
    parts = dict(split.tensors(CPU))
    assert whole.keys() == parts.keys() and all(torch.equal(whole[n], parts[n]) for n in whole)


def test_a_malformed_or_incomplete_index_is_refused(tmp_path: Path):
    (tmp_path / "model.safetensors.index.json").write_text("{")
    with pytest.raises(CheckpointError, match="is malformed"):
        open_weights(tmp_path)
    index = {"weight_map": {"a": "x.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"shard x\.safetensors named in the index"):
        open_weights(tmp_path)
