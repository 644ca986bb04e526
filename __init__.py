"""Arbor: a prefix-sharing, structured-generation runtime for LLMs.

The repository root is the `arbor` package; the folders beside this file are its
subpackages (`arbor.runtime`, `arbor.radix`, `arbor.grammar`, `arbor.kernels`,
`arbor.frontend_lang`). This module is SGLang's public surface, so an SGLang program
runs with only its import changed:

    import arbor as sgl                  # instead of `import sglang as sgl`

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=32))

    sgl.set_default_backend(sgl.RuntimeEndpoint("http://127.0.0.1:30000"))
    print(qa.run(question="Hi")["answer"])
"""

from __future__ import annotations

from typing import Any

from arbor.frontend_lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_default_backend,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from arbor.frontend_lang.backends import BackendError, EngineBackend, OpenAI, RuntimeEndpoint
from arbor.frontend_lang.chat_template import ChatTemplate, get_chat_template
from arbor.frontend_lang.interpreter import ProgramState, ProgramStateGroup
from arbor.frontend_lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR
from arbor.frontend_lang.tools import call_tool, gen_tool_call

Runtime = EngineBackend  # SGLang's name for a runtime owned by the program

__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "BackendError",
    "ChatTemplate",
    "Engine",
    "EngineBackend",
    "OpenAI",
    "ProgramState",
    "ProgramStateGroup",
    "Runtime",
    "RuntimeEndpoint",
    "ServerArgs",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "call_tool",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "gen_tool_call",
    "get_chat_template",
    "get_default_backend",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "user",
    "user_begin",
    "user_end",
]


def __getattr__(name: str) -> Any:
    # Lazy, so `import arbor` (the DSL, `arbor --help`) does not load torch.
    if name == "Engine":
        from arbor.runtime.engine import Engine

        return Engine
    if name == "ServerArgs":
        from arbor.runtime.config import ServerArgs

        return ServerArgs
    raise AttributeError(f"module 'arbor' has no attribute {name!r}")
