"""Engine: Arbor in-process. Starts the scheduler and detokenizer processes, runs the
TokenizerManager on a background event loop, and offers generate() in sync, async and
streaming forms, each returning the native API's shape {text, output_ids, meta_info}."""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.generate_input import split_batch
from arbor.runtime.io.launch import Launch
from arbor.runtime.io.outputs import GenerateOutput, StreamShaper
from arbor.runtime.io.tokenizer_manager import Prepared, TokenizerManager
from arbor.runtime.server.chat import role_markers

T = TypeVar("T")

Prompt = str | list[str] | None
InputIds = list[int] | list[list[int]] | None
Params = dict[str, Any] | list[dict[str, Any]] | None
OPTIONS = {"logprob_start_len", "top_logprobs_num", "return_text_in_logprobs", "require_reasoning"}  # **options
PROGRESS_MIN_BATCH = 32  # batches at least this large show a progress bar by default


class Engine:
    """Loads a checkpoint (None = the built-in tiny one) into a scheduler process.

    `server_args` are `arbor serve`'s flags by name (max_total_tokens=4096, tp_size=2).
    Use as a context manager, or call `shutdown()`; the children also exit on their own
    if this process dies.
    """

    def __init__(self, model_path: str | None = None, **server_args: Any) -> None:
        self.args = ServerArgs.from_flags(model_path=model_path, **server_args)
        self.launch = Launch(self.args)  # a bad checkpoint fails here, in this process, in one line
        self.model_path, self.tokenizer = self.launch.model_path, self.launch.tokenizer
        self.children = self.launch.children
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="arbor-engine-loop", daemon=True)
        self._thread.start()
        self._closed = False
        try:  # on the loop's thread: the front door's sockets belong to that loop
            self.manager: TokenizerManager = self._call(self.launch.start())
        except BaseException:
            self.shutdown()
            raise
        atexit.register(self.shutdown)

    # ------------------------------------------------------------- generate

    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: Params = None,
        input_ids: InputIds = None,
        stream: bool = False,
        return_logprob: bool = False,
        cache_salt: str | None = None,
        rid: str | list[str] | None = None,
        progress: bool | None = None,
        **logprob_options: Any,
    ) -> dict[str, Any] | list[dict[str, Any]] | Iterator[dict[str, Any]]:
        """Generate for one prompt (a dict back; a list of n for n > 1) or a list (a list
        back, in order, n per prompt); SGLang's Engine argument order. `stream=True` (one prompt) returns an iterator of
        dicts with cumulative text. `rid` names the request(s) for `abort`. `progress` shows
        a bar (default: batches >= 32). `logprob_options`: logprob_start_len (>= 0 adds
        prompt logprobs), top_logprobs_num, return_text_in_logprobs; also require_reasoning
        (with a reasoning parser: the constraint starts after </think>)."""
        prepared, single = self._prepare(
            prompt,
            input_ids,
            sampling_params,
            rid,
            dict(stream=stream, return_logprob=return_logprob, cache_salt=cache_salt, **logprob_options),
        )
        if stream:
            return self._stream(prepared[0])
        show = progress if progress is not None else len(prepared) >= PROGRESS_MIN_BATCH
        return _shape(self._call(self._collect(prepared, show)), single)

    async def async_generate(
        self,
        prompt: Prompt = None,
        sampling_params: Params = None,
        input_ids: InputIds = None,
        stream: bool = False,
        return_logprob: bool = False,
        cache_salt: str | None = None,
        rid: str | list[str] | None = None,
        **logprob_options: Any,
    ) -> dict[str, Any] | list[dict[str, Any]] | AsyncIterator[dict[str, Any]]:
        """`generate` for asyncio callers (any event loop); `stream=True` gives an async iterator."""
        prepared, single = self._prepare(
            prompt,
            input_ids,
            sampling_params,
            rid,
            dict(stream=stream, return_logprob=return_logprob, cache_salt=cache_salt, **logprob_options),
        )
        if stream:
            return self._astream(prepared[0])
        results = await asyncio.wrap_future(self._submit(self._collect(prepared, False)))
        return _shape(results, single)

    def stats(self) -> dict[str, float]:
        """Scheduler counters: steps, tokens, cache hits, free slots, invariant_ok, ..."""
        return self._call(self.manager.stats())

    def flush_cache(self) -> dict[str, float]:
        """Drop every cached prefix that no running request holds."""
        return self._call(self.manager.flush_cache())

    def abort(self, rid: str) -> None:
        self._call(self.manager.abort(rid))

    def get_model_info(self) -> dict[str, Any]:
        return {"model_path": self.model_path, "chat_roles": role_markers(self.tokenizer), **self.manager.info}

    def _prepare(
        self,
        prompt: Prompt,
        input_ids: InputIds,
        params: Params,
        rid: str | list[str] | None,
        options: dict[str, Any],
    ) -> tuple[list[Prepared], bool]:
        unknown = sorted(set(options) - OPTIONS - {"stream", "return_logprob", "cache_salt"})
        if unknown:
            raise ValueError(f"unknown argument(s) {', '.join(unknown)}; supported: {', '.join(sorted(OPTIONS))}")
        inputs, single = split_batch(prompt, input_ids, params, rid=rid, **options)
        if options["stream"] and not single:
            raise ValueError("stream=True takes one prompt; call generate once per prompt to stream several")
        return self.manager.prepare_batch(inputs), single

    async def _collect(self, prepared: list[Prepared], show: bool) -> list[list[dict[str, Any]]]:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(prepared), desc="generate", unit="req", disable=not show)

        async def one(p: Prepared) -> list[dict[str, Any]]:
            outs = [out async for out in self.manager.run(p)]
            bar.update(1)
            return [o.to_json() for o in sorted(outs, key=_index)]

        try:
            return await asyncio.gather(*(one(p) for p in prepared))
        finally:
            bar.close()

    def _stream(self, prepared: Prepared) -> Iterator[dict[str, Any]]:
        agen = self.manager.run(prepared)
        shape = StreamShaper(self.args.http.incremental_streaming_output)
        try:
            while True:
                try:
                    yield shape(self._call(agen.__anext__()))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._call(agen.aclose())  # an early stop aborts the request

    async def _astream(self, prepared: Prepared) -> AsyncIterator[dict[str, Any]]:
        agen = self.manager.run(prepared)
        shape = StreamShaper(self.args.http.incremental_streaming_output)
        try:
            while True:
                try:
                    yield shape(await asyncio.wrap_future(self._submit(agen.__anext__())))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                await asyncio.wrap_future(self._submit(agen.aclose()))

    # ------------------------------------------------------------ lifecycle

    def _submit(self, coro: Awaitable[T]) -> Future[T]:
        if self._closed:
            if asyncio.iscoroutine(coro):
                coro.close()
            raise RuntimeError("the engine is shut down")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    def _call(self, coro: Awaitable[T]) -> T:
        return self._submit(coro).result()

    def shutdown(self) -> None:
        """Stop the child processes (no orphans) and remove the socket directory. Idempotent."""
        if self._closed:
            return
        try:
            self._call(self.launch.stop())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            atexit.unregister(self.shutdown)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _index(out: GenerateOutput) -> int:
    return out.index or 0


def _shape(results: list[list[dict[str, Any]]], single: bool) -> dict[str, Any] | list[dict[str, Any]]:
    flat = [out for outs in results for out in outs]
    return flat[0] if single and len(flat) == 1 else flat
