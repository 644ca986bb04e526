"""Arbor's serving runtime: Engine, scheduler, model execution and servers."""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "ServerArgs"]


def __getattr__(name: str) -> Any:
    # Lazy, so `import runtime.config` (e.g. for `arbor --help`) does not load torch.
    if name == "Engine":
        from runtime.engine import Engine

        return Engine
    if name == "ServerArgs":
        from runtime.config import ServerArgs

        return ServerArgs
    raise AttributeError(name)
