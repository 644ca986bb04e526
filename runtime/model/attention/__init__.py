"""Attention backends, by name; `create_backend` picks one for a device."""

from __future__ import annotations

from runtime.memory import KVPool, ReqToTokenPool
from runtime.model.attention.base import AttentionBackend
from runtime.model.attention.torch_backend import TorchAttnBackend

BACKENDS: dict[str, type[AttentionBackend]] = {"torch": TorchAttnBackend}


def create_backend(
    name: str, kv_pool: KVPool, req_to_token: ReqToTokenPool, scale: float
) -> AttentionBackend:
    """Instantiate backend `name`; "auto" is torch until the Triton backend lands."""
    chosen = "torch" if name == "auto" else name
    if chosen not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose auto or {', '.join(BACKENDS)}")
    return BACKENDS[chosen](kv_pool, req_to_token, scale)


__all__ = ["BACKENDS", "AttentionBackend", "create_backend"]
