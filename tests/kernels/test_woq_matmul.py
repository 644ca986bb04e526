"""The Triton weight-only GEMM (`kernels/woq_matmul.py`, in Triton's interpreter here) against
the dequantize-then-matmul reference, on the llmcompressor-written checkpoints' layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arbor.kernels.woq_matmul import woq_matmul_triton
from arbor.runtime.model.loader import load_model
from arbor.runtime.model.quant.linear import QuantLinear

DATA = Path(__file__).resolve().parents[1] / "data" / "quant"


@pytest.mark.parametrize("name", ["w8a16", "w4a16", "w4a16-asym", "fp8", "awq", "gptq", "gptq8"])
def test_woq_matmul_matches_the_dequantized_weight(name: str) -> None:
    model, _ = load_model(DATA / name, torch.float32, torch.device("cpu"))
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)][:3]  # qkv, o, gate_up of layer 0
    g = torch.Generator().manual_seed(0)
    for layer in layers:
        w = layer.weight
        for rows in (1, 7, 33):
            x = torch.randn(rows, w.cols, generator=g)
            ref = x @ w.dequantize().T
            sorted_x = x if w.perm is None else x[:, w.perm]  # act-order: codes' columns sorted by group
            got = woq_matmul_triton(sorted_x, w.codes, w.scale, w.zero, w.group, w.kind)
            assert (got - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
