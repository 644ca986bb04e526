"""The DSL's public calls: `function`, `gen` and friends, `select`, roles, backends."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from arbor.frontend_lang.backends import Backend
from arbor.frontend_lang.interpreter import ProgramState, StreamExecutor
from arbor.frontend_lang.ir import (
    DTYPE_REGEX,
    ExprList,
    Gen,
    RoleBegin,
    RoleEnd,
    SamplingParams,
    Select,
    as_expr,
)

DEFAULT_MAX_NEW_TOKENS = 128
_default_backend: Backend | None = None


def set_default_backend(backend: Backend) -> None:
    """The backend programs use when `run` is given none."""
    global _default_backend
    _default_backend = backend


def get_default_backend() -> Backend:
    """The backend set by set_default_backend (an error says how if there is none)."""
    if _default_backend is None:
        raise RuntimeError("no backend: call set_default_backend(RuntimeEndpoint(url)) or pass backend=")
    return _default_backend


def flush_cache(backend: Backend | None = None) -> None:
    """Drop the backend's cached prefixes."""
    (backend or get_default_backend()).flush_cache()


class SglFunction:
    """A program: a Python function whose first argument is the state `s`."""

    __name__: str  # the function's, like its other attributes (functools.update_wrapper)

    def __init__(self, func: Callable[..., Any], bound: dict[str, Any] | None = None) -> None:
        self.func = func
        self.bound = bound or {}
        functools.update_wrapper(self, func)

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy with some program arguments fixed."""
        return SglFunction(self.func, {**self.bound, **kwargs})

    def run(
        self,
        *args: Any,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        stream: bool = False,
        backend: Backend | None = None,
        **kwargs: Any,
    ) -> ProgramState:
        """Run the program once. Keywords that are sampling parameters (temperature, stop,
        top_p, ...) become every gen's defaults; the rest go to the program. With
        stream=True the state is returned at once; iterate `text_iter()`."""
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in SamplingParams.__dataclass_fields__}
        defaults = SamplingParams(max_new_tokens=max_new_tokens, **sampling)
        executor = StreamExecutor(backend or get_default_backend(), defaults, stream)
        state = ProgramState(executor)
        try:
            self.func(state, *args, **{**self.bound, **kwargs})
            if not stream:
                state.sync()
        finally:
            executor.end()
        return state

    __call__ = run

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        *,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        backend: Backend | None = None,
        **sampling: Any,
    ) -> list[ProgramState]:
        """Run the program once per dict of arguments, `num_threads` at a time (auto: up to
        64), states back in order; `progress_bar` shows tqdm."""
        threads = min(64, max(1, len(batch_kwargs))) if num_threads == "auto" else int(num_threads)
        chosen = backend or get_default_backend()
        with ThreadPoolExecutor(threads, thread_name_prefix="sgl-batch") as pool:
            futures = [pool.submit(self.run, backend=chosen, **sampling, **kw) for kw in batch_kwargs]
            if progress_bar:
                from tqdm.auto import tqdm

                for _ in tqdm(futures, desc=self.__name__):
                    _.result()
            return [f.result() for f in futures]


def function(func: Callable[..., Any] | None = None, **options: Any) -> Any:
    """`@function` or `@function(...)`: make a program. Options (SGLang's
    num_api_spec_tokens) are accepted and ignored: Arbor's API speculation is not built."""
    if func is None:
        return lambda f: SglFunction(f)
    return SglFunction(func)


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    min_tokens: int | None = None,
    stop: str | list[str] | None = None,
    stop_token_ids: list[int] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    repetition_penalty: float | None = None,
    ignore_eos: bool | None = None,
    seed: int | None = None,
    return_logprob: bool = False,
    top_logprobs_num: int = 0,
    dtype: type | None = None,
    regex: str | None = None,
    json_schema: str | dict | None = None,
    choices: list[str] | None = None,
    choices_method: str = "token_length_normalized",
) -> Gen | Select:
    """Generate into variable `name`. `regex`, `json_schema` (str or dict) or `dtype` (int,
    float, bool, str) constrain the output; `choices` makes it a `select`."""
    if choices is not None:
        return Select(name, list(choices), temperature or 0.0, choices_method)
    if dtype is not None:
        if dtype not in DTYPE_REGEX:
            raise ValueError(f"dtype must be one of int, float, bool, str, not {dtype!r}")
        if regex is not None or json_schema is not None:
            raise ValueError("give dtype or regex/json_schema, not both")
        regex = DTYPE_REGEX[dtype]
    if json_schema is not None and not isinstance(json_schema, str):
        json_schema = json.dumps(json_schema)
    params = SamplingParams(
        max_new_tokens=max_tokens,
        min_new_tokens=min_tokens,
        stop=stop,
        stop_token_ids=stop_token_ids,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        repetition_penalty=repetition_penalty,
        ignore_eos=ignore_eos,
        seed=seed,
        regex=regex,
        json_schema=json_schema,
    )
    return Gen(name, params, return_logprob, top_logprobs_num)


def gen_int(name: str | None = None, **kwargs: Any) -> Gen | Select:
    """`gen` of an integer (REGEX_INT)."""
    return gen(name, dtype=int, **kwargs)


def gen_string(name: str | None = None, **kwargs: Any) -> Gen | Select:
    """`gen` of a double-quoted string (REGEX_STR)."""
    return gen(name, dtype=str, **kwargs)


def select(
    name: str | None = None,
    choices: list[str] | None = None,
    temperature: float = 0.0,
    choices_method: str = "token_length_normalized",
) -> Select:
    """Pick one of `choices` by the model's likelihood (all scored in one batched call)."""
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    return Select(name, list(choices), temperature, choices_method)


def _role(role: str, expr: Any = None) -> ExprList:
    inner = [] if expr is None else [as_expr(expr)]
    return ExprList([RoleBegin(role), *inner, RoleEnd(role)])


def system(expr: Any = None) -> ExprList:
    """A system message around `expr`, framed by the chat template."""
    return _role("system", expr)


def user(expr: Any = None) -> ExprList:
    """A user message around `expr`, framed by the chat template."""
    return _role("user", expr)


def assistant(expr: Any = None) -> ExprList:
    """A assistant message around `expr`, framed by the chat template."""
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    """Open a system message; what follows until system_end() is its content."""
    return RoleBegin("system")


def system_end() -> RoleEnd:
    """Close the open system message."""
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    """Open a user message; what follows until user_end() is its content."""
    return RoleBegin("user")


def user_end() -> RoleEnd:
    """Close the open user message."""
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    """Open a assistant message; what follows until assistant_end() is its content."""
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    """Close the open assistant message."""
    return RoleEnd("assistant")
