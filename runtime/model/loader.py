"""Loads a Hugging Face checkpoint directory into our own model implementation."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from arbor.runtime.model.model_config import CheckpointError, ModelConfig
from arbor.runtime.model.models import model_class
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.model.quant.apply import quantize_linears

Shard = Callable[[str], "tuple[int, int, int] | None"]  # HF tensor name -> (dim, lo, hi) to read


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device, tp: TensorParallel = SINGLE
               ) -> tuple[nn.Module, ModelConfig]:
    """Build the model for `path/config.json` (this rank's share of it under tensor
    parallelism) and fill it from its safetensors files, reading only that share."""
    cfg = ModelConfig.from_dir(path)
    files = weight_files(Path(path))
    if cfg.quant is not None and tp.size > 1:
        raise CheckpointError(f"{path}: quantized checkpoints do not run with --tp-size > 1 yet")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are born in `dtype`, never converted
    try:
        with torch.device("meta"):
            model = model_class(cfg)(cfg, tp)
    finally:
        torch.set_default_dtype(previous)
    if cfg.quant is not None:
        quantize_linears(model, cfg.quant, model.linear_parts)
    model = model.to_empty(device=device)
    model.load_weights(_iter_tensors(files, device, model.shard))
    return model.eval(), cfg


def weight_files(path: Path) -> list[Path]:
    """The single model.safetensors, or every shard named by model.safetensors.index.json."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{index} is malformed: {e}") from None
        missing = [n for n in names if not (path / n).exists()]
        if missing:
            raise CheckpointError(f"{path}: shard {missing[0]} named in the index is missing")
        return [path / n for n in names]
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise CheckpointError(f"{path} has no model.safetensors or model.safetensors.index.json")


def _iter_tensors(files: list[Path], device: torch.device, shard: Shard) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    for f in files:
        try:
            with safe_open(str(f), framework="pt", device=str(device)) as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                    part = shard(name)
                    if part is None:
                        yield name, handle.get_tensor(name)
                        continue
                    dim, lo, hi = part
                    view = handle.get_slice(name)
                    yield name, view[lo:hi] if dim == 0 else view[:, lo:hi]
        except SafetensorError as e:
            raise CheckpointError(f"{f} is not a readable safetensors file: {e}") from None
