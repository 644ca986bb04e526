"""Weight sources by --load-format name; a new format is one WeightSource class added here."""

from __future__ import annotations

from pathlib import Path

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.weights.base import Shard, WeightSource, cut
from arbor.runtime.model.weights.safetensors import SafetensorsSource

WEIGHT_SOURCES: dict[str, type[WeightSource]] = {"safetensors": SafetensorsSource}


def open_weights(path: str | Path, load_format: str = "auto") -> WeightSource:
    """The source that reads `path` in `load_format`; auto = the first format `path` holds."""
    path = Path(path)
    if load_format != "auto":
        if load_format not in WEIGHT_SOURCES:
            raise CheckpointError(f"unknown load format {load_format!r}; choose auto or {', '.join(WEIGHT_SOURCES)}")
        return WEIGHT_SOURCES[load_format](path)
    for source in WEIGHT_SOURCES.values():
        if source.holds(path):
            return source(path)
    expected = " or ".join(source.expects for source in WEIGHT_SOURCES.values())
    raise CheckpointError(f"{path} has no {expected}")


__all__ = ["WEIGHT_SOURCES", "Shard", "WeightSource", "cut", "open_weights"]
