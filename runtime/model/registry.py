"""The model registry: config.json's `architectures[0]` -> the CausalLM that serves it.

An architecture is registered here, in one line: its module under runtime/model/models and
its class. Modules import when a model of theirs loads, so reading a config (the server and
the Engine check the checkpoint first) imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arbor.runtime.model.causal_lm import CausalLM

ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("llama", "LlamaForCausalLM"),
}


def model_class(architecture: str) -> type[CausalLM]:
    """The CausalLM class registered for `architecture` (ModelConfig.from_dir has checked it)."""
    module, name = ARCHITECTURES[architecture]
    cls: type[CausalLM] = getattr(importlib.import_module(f"arbor.runtime.model.models.{module}"), name)
    return cls
