"""Loads a Hugging Face checkpoint directory into our own model implementation."""

from __future__ import annotations

from pathlib import Path

import torch

from arbor.runtime.model.causal_lm import CausalLM
from arbor.runtime.model.model_config import CheckpointError, ModelConfig
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.model.quant.apply import quantize_linears
from arbor.runtime.model.registry import model_class
from arbor.runtime.model.weights import open_weights


def load_model(
    path: str | Path, dtype: torch.dtype, device: torch.device, tp: TensorParallel = SINGLE, load_format: str = "auto"
) -> tuple[CausalLM, ModelConfig]:
    """Build the model for `path/config.json` (this rank's share of it under tensor
    parallelism) and fill it from its weights in `load_format`, reading only that share."""
    cfg = ModelConfig.from_dir(path)
    weights = open_weights(path, load_format)
    if cfg.quant is not None and tp.size > 1:
        raise CheckpointError(f"{path}: quantized checkpoints do not run with --tp-size > 1 yet")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are born in `dtype`, never converted
    try:
        with torch.device("meta"):
            model = model_class(cfg.architecture)(cfg, tp)
    finally:
        torch.set_default_dtype(previous)
    if cfg.quant is not None:
        quantize_linears(model, cfg.quant)
    model = model.to_empty(device=device)
    model.load_weights(weights.tensors(device, model.shard))
    return model.eval(), cfg
