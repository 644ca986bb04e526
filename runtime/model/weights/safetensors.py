"""Hugging Face safetensors checkpoints: model.safetensors, or the shards of an index."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.weights.base import Shard, WeightSource

if TYPE_CHECKING:
    import torch

INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"


class SafetensorsSource(WeightSource):
    """Reads each tensor, or only this rank's slice of it, straight from the files."""

    expects = f"{SINGLE} or {INDEX}"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.files = weight_files(path)

    @classmethod
    def holds(cls, path: Path) -> bool:
        return (path / INDEX).exists() or (path / SINGLE).exists()

    def tensors(self, device: torch.device, shard: Shard | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import SafetensorError, safe_open

        for f in self.files:
            try:
                with safe_open(str(f), framework="pt", device=str(device)) as handle:
                    for name in handle.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                        part = shard(name) if shard is not None else None
                        if part is None:
                            yield name, handle.get_tensor(name)
                            continue
                        dim, lo, hi = part
                        view = handle.get_slice(name)
                        yield name, view[lo:hi] if dim == 0 else view[:, lo:hi]
            except SafetensorError as e:
                raise CheckpointError(f"{f} is not a readable safetensors file: {e}") from None


def weight_files(path: Path) -> list[Path]:
    """The single model.safetensors, or every shard named by model.safetensors.index.json."""
    index = path / INDEX
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as e:
            raise CheckpointError(f"{index} is malformed: {e}") from None
        missing = [n for n in names if not (path / n).exists()]
        if missing:
            raise CheckpointError(f"{path}: shard {missing[0]} named in the index is missing")
        return [path / n for n in names]
    single = path / SINGLE
    if single.exists():
        return [single]
    raise CheckpointError(f"{path} has no {SafetensorsSource.expects}")
