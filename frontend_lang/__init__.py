"""The SGLang-compatible DSL for multi-call agent programs.

    import frontend_lang as sgl          # instead of `import sglang as sgl`

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=32))

    sgl.set_default_backend(sgl.RuntimeEndpoint("http://127.0.0.1:30000"))
    print(qa.run(question="Hi")["answer"])
"""

from frontend_lang.api import (
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
from frontend_lang.backends import BackendError, EngineBackend, OpenAI, RuntimeEndpoint
from frontend_lang.chat_template import ChatTemplate, get_chat_template
from frontend_lang.interpreter import ProgramState, ProgramStateGroup
from frontend_lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

Runtime = EngineBackend  # SGLang's name for a runtime owned by the program

__all__ = [
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "BackendError", "ChatTemplate", "EngineBackend",
    "OpenAI", "ProgramState", "ProgramStateGroup", "Runtime", "RuntimeEndpoint", "assistant", "assistant_begin",
    "assistant_end", "flush_cache", "function", "gen", "gen_int", "gen_string", "get_chat_template",
    "get_default_backend", "select", "set_default_backend", "system", "system_begin", "system_end", "user",
    "user_begin", "user_end",
]
