"""Shared fixtures: tiny checkpoints written once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run in Triton's interpreter; it must be chosen before any
# kernel module is imported (the jit decorator reads it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from arbor.runtime.tiny_model import TinySpec, make_tiny_model

SPECS = {
    "llama": TinySpec(arch="llama"),
    "qwen2": TinySpec(arch="qwen2", seed=1),
    "qwen3": TinySpec(arch="qwen3", seed=2, head_dim=32),
    "mistral": TinySpec(arch="mistral", seed=3, heads=4, kv_heads=4),
    "llama-tied-gqa4": TinySpec(arch="llama", seed=4, heads=8, kv_heads=2, tie_word_embeddings=True),
    "llama-long": TinySpec(arch="llama", seed=6, max_position_embeddings=4096),
    "llama3-rope": TinySpec(
        arch="llama",
        seed=5,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_root: Path):
    """tiny_model(name) -> path of that checkpoint, written on first use."""

    def get(name: str) -> Path:
        path = tiny_root / name
        if not (path / "config.json").exists():
            make_tiny_model(path, SPECS[name])
        return path

    return get
