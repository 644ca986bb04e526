"""Arbor's CPU kernels (`cpu_ops.cpp`): paged attention that reads the KV pool in place,
fused RMSNorm / residual add, rotary embedding and SiLU-and-mul, a row argmax and the KV store; and
weight-only quantized linears (`cpu_quant.cpp`, used by runtime/model/quant/linear.py).

They are compiled once per machine at first use with torch's own extension builder (about
half a minute; cached under `~/.cache/torch_extensions`). Where no compiler is present, or
`ARBOR_CPU_KERNELS=0`, `load()` returns None and callers keep the torch references in
`reference.py`, which compute the same values.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from arbor.kernels.reference import rmsnorm_ref, rotary_ref, silu_and_mul_ref, store_kv_ref

logger = logging.getLogger(__name__)
SOURCES = [Path(__file__).with_name(name) for name in ("cpu_ops.cpp", "cpu_quant.cpp", "cpu_woq_bf16.cpp")]
FLAGS = ["-O3", "-march=native", "-fopenmp"]  # OpenMP: at::parallel_for runs on torch's own libgomp
_ops: Any = False  # False: not tried yet; None: unavailable


def load() -> Any:
    """`torch.ops.arbor_cpu`, building it on first call; None when it cannot be built."""
    global _ops
    if _ops is not False:
        return _ops
    _ops = None
    if os.environ.get("ARBOR_CPU_KERNELS", "1") == "0":
        return None
    try:
        from torch.utils import cpp_extension

        # The name carries the source and the CPU, since -march=native builds for this CPU only.
        code = b"".join(src.read_bytes() for src in SOURCES)
        digest = hashlib.sha256(code + " ".join(FLAGS).encode() + _cpu_model().encode()).hexdigest()[:10]
        t0 = time.perf_counter()
        cpp_extension.load(
            name=f"arbor_cpu_{digest}",
            sources=[str(src) for src in SOURCES],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
        _ops = torch.ops.arbor_cpu
        logger.info("CPU kernels ready in %.1f s", time.perf_counter() - t0)
    except Exception as exc:  # no compiler, no ninja, a failed build: keep the torch path
        logger.warning("CPU kernels unavailable, using torch ops instead: %s", str(exc).splitlines()[0][:200])
    return _ops


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith("flags")), "")


# Same contracts as the references; inputs the kernels do not take go to the reference.


def rmsnorm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    ops = load()
    if ops is None or weight.dtype != x.dtype or x.stride(-1) != 1:
        return rmsnorm_ref(x, weight, eps, residual)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if residual is None:
        return ops.rmsnorm(x2, weight, eps).view(shape)
    out, total = ops.add_rmsnorm(x2, residual.reshape(-1, shape[-1]), weight, eps)
    return out.view(shape), total.view(shape)


def rotary_cpu(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    ops = load()
    if ops is None or cos.dtype != torch.float32 or q.stride(-1) != 1 or k.stride(-1) != 1:
        return rotary_ref(positions, q, k, cos, sin)
    ops.rotary(positions, q, k, cos, sin)
    return q, k


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    ops = load()
    if ops is None or x.dim() != 2 or x.stride(-1) != 1:
        return silu_and_mul_ref(x)
    return ops.silu_and_mul(x)


def store_kv_cpu(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """k_pool[slots[i]] = k[i] (and v), one copy per token's row instead of two index_put ops."""
    ops = load()
    if (
        ops is None
        or k.dtype != k_pool.dtype
        or v.dtype != v_pool.dtype
        or slots.dtype != torch.int64
        or any(t.stride(-1) != 1 or t.stride(-2) != t.shape[-1] for t in (k, v))
    ):
        store_kv_ref(k_pool, v_pool, slots, k, v)
        return
    ops.store_kv(k_pool, v_pool, slots, k, v)


def argmax_cpu(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum, as `logits.max(-1).indices` (a NaN wins), read in the logits'
    own dtype."""
    ops = load()
    if ops is None or logits.device.type != "cpu" or logits.dim() != 2 or logits.stride(-1) != 1 or not logits.shape[1]:
        return logits.max(-1).indices
    return ops.argmax_rows(logits)
