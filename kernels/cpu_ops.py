"""Arbor's CPU kernels (`cpu_ops.cpp`): paged attention that reads the KV pool in place, and
fused RMSNorm / residual add, rotary embedding and SiLU-and-mul.

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

logger = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("cpu_ops.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp-simd"]
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
        digest = hashlib.sha256(SOURCE.read_bytes() + _cpu_model().encode()).hexdigest()[:10]
        t0 = time.perf_counter()
        cpp_extension.load(name=f"arbor_cpu_{digest}", sources=[str(SOURCE)], extra_cflags=FLAGS,
                           is_python_module=False, verbose=False)
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
