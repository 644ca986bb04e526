"""Model implementations by family name (see ModelConfig.family)."""

from __future__ import annotations

from torch import nn

from arbor.runtime.model.model_config import ModelConfig
from arbor.runtime.model.models.llama import LlamaForCausalLM

MODELS: dict[str, type[nn.Module]] = {"llama": LlamaForCausalLM}


def model_class(cfg: ModelConfig) -> type[nn.Module]:
    """The implementation for `cfg`'s architecture."""
    return MODELS[cfg.family]
