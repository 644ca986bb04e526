"""One runtime's start-up, shared by `Engine` and the HTTP server: the checkpoint and its
tokenizer, the scheduler and detokenizer processes, and the TokenizerManager in front of them."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.processes import ChildProcesses
from arbor.runtime.io.tokenizer import load_tokenizer
from arbor.runtime.io.tokenizer_manager import TokenizerManager

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)
START_TIMEOUT_S = 600.0


class Launch:
    """Resolves what to serve in the caller's process (a bad checkpoint fails here, before
    any process starts), then `start`s and `stop`s the processes on the caller's event loop."""

    def __init__(self, args: ServerArgs) -> None:
        """`args.model.path` None serves the built-in tiny checkpoint (written on first use)."""
        from arbor.runtime.model.model_config import ModelConfig
        from arbor.runtime.tiny_model import builtin_model_path

        self.args = args
        self.model_path = args.model.path or str(builtin_model_path())
        ModelConfig.from_dir(self.model_path)
        self.tokenizer_path = args.model.tokenizer_path or self.model_path
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(self.tokenizer_path)
        self.children = ChildProcesses(args, self.model_path, self.tokenizer_path)
        self.manager: TokenizerManager | None = None

    async def start(self, timeout_s: float = START_TIMEOUT_S) -> TokenizerManager:
        """Start the children and wait until each is ready; the front door's sockets belong to
        the running loop. If start-up fails, everything is stopped and the error re-raised."""
        args = self.args
        self.manager = TokenizerManager(args.http, args.grammar, args.disagg, self.tokenizer, self.children)
        self.children.start()
        try:
            await self.manager.start(timeout_s)
        except BaseException:
            await self.stop()
            raise
        return self.manager

    async def stop(self) -> None:
        """Ask the children to exit, then stop them for good (no orphans) and remove their
        socket directory. Idempotent."""
        manager, self.manager = self.manager, None
        if manager is not None:
            try:
                await manager.shutdown()
            except Exception:
                logger.exception("front door shutdown failed; stopping the processes anyway")
        await asyncio.get_running_loop().run_in_executor(None, self.children.stop)
