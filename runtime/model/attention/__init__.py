"""Attention backends, by name; `create_backend` picks one for a device."""

from __future__ import annotations

import importlib

from arbor.runtime.kv.pool import KVPool, ReqToTokenPool
from arbor.runtime.model.attention.base import AttentionBackend

BACKENDS = {
    "torch": "arbor.runtime.model.attention.torch_backend:TorchAttnBackend",
    "triton": "arbor.runtime.model.attention.triton_backend:TritonAttnBackend",
}


def resolve_backend(name: str, device_type: str) -> str:
    """auto = triton on CUDA, torch elsewhere."""
    if name == "auto":
        return "triton" if device_type == "cuda" else "torch"
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose auto or {', '.join(BACKENDS)}")
    return name


def create_backend(name: str, kv_pool: KVPool, req_to_token: ReqToTokenPool, scale: float) -> AttentionBackend:
    """Instantiate backend `name` ("auto" resolved for the pool's device). Imported on use, so
    the torch path never loads Triton."""
    module, cls = BACKENDS[resolve_backend(name, kv_pool.k[0].device.type)].split(":")
    return getattr(importlib.import_module(module), cls)(kv_pool, req_to_token, scale)


__all__ = ["BACKENDS", "AttentionBackend", "create_backend", "resolve_backend"]
