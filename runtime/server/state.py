"""What every route shares: ServerState (the front door, tokenizer, metrics, limits),
body reading with a size limit, and server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from arbor.runtime.config import HttpArgs, ServerArgs
from arbor.runtime.io.generate_input import GenerateInput, bootstrap_of
from arbor.runtime.io.launch import Launch
from arbor.runtime.io.messages import Bootstrap
from arbor.runtime.io.outputs import GenerateOutput
from arbor.runtime.io.tokenizer_manager import EngineDead, Prepared, TokenizerManager
from arbor.runtime.server.auth import OPEN, Caller, Keys
from arbor.runtime.server.bootstrap_gate import BootstrapGate
from arbor.runtime.server.chat import ChatTokenizer
from arbor.runtime.server.errors import ApiError, decode, refusing
from arbor.runtime.server.metrics import Metrics
from arbor.runtime.server.redact import hide
from arbor.runtime.server.tenant_usage import TenantUsage

logger = logging.getLogger("arbor.server")
DISCONNECT_POLL_S = 0.25
ENGINE_WATCH_S = 0.25
INLINE_TOKENIZE_CHARS = 16_384  # shorter prompts tokenize on the loop (faster than a thread hop)


class ServerState:
    """Everything the routes share: the front door, the tokenizer, metrics, limits."""

    def __init__(self, args: ServerArgs) -> None:
        """`args` starts the processes; the routes read only `http`, their own section."""
        self.args = args
        self.http = args.http
        self.launch = Launch(args)  # a bad checkpoint fails before any process starts
        self.model_path, self.tokenizer_path = self.launch.model_path, self.launch.tokenizer_path
        self.tokenizer = self.launch.tokenizer
        self.model_name = args.http.served_model_name or Path(self.model_path).name
        for directory in (self.model_path, self.tokenizer_path):  # errors name the model, never its directory
            hide(directory, self.model_name)
        self.chat = ChatTokenizer(self.tokenizer)
        self.metrics = Metrics(self.model_name)
        self.usage = TenantUsage()
        self.manager: TokenizerManager | None = None
        self.on_engine_death: Callable[[], None] | None = None
        self.tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="arbor-tokenizer")
        self._watcher: asyncio.Task[None] | None = None
        self.inflight = 0
        self.keys = Keys.load(args.http, args.disagg)
        self.gate = BootstrapGate(args.disagg)

    async def start(self) -> None:
        self.manager = await self.launch.start()
        self._watcher = asyncio.create_task(self._stop_when_engine_dies())

    async def _stop_when_engine_dies(self) -> None:
        """A dead engine takes the server down (so a supervisor restarts it), as SGLang does:
        `on_engine_death` (set by `arbor serve`) stops uvicorn, which then exits non-zero."""
        assert self.manager is not None
        while self.manager.dead is None:
            await asyncio.sleep(ENGINE_WATCH_S)
        logger.error("%s; shutting the server down", self.manager.dead)
        if self.on_engine_death is not None:
            self.on_engine_death()

    async def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await self.launch.stop()

    def front(self) -> TokenizerManager:
        if self.manager is None or self.manager.dead is not None:
            reason = self.manager.dead if self.manager is not None else "the server is starting"
            raise ApiError(503, f"the runtime is not available: {reason}", "server_error")
        return self.manager

    def salt(self, caller: Caller, cache_salt: str | None, extra_key: str | None = None) -> str | None:
        """The cache namespace: the caller's tenant, refined by cache_salt and SGLang's extra_key."""
        for name, value in (("cache_salt", cache_salt), ("extra_key", extra_key)):
            if value is not None and (not isinstance(value, str) or len(value) > 256):
                raise ApiError(400, f"{name} must be a string of at most 256 characters", param=name)
        parts = [p for p in (caller.tenant, cache_salt, extra_key) if p]
        return ":".join(parts) or None

    def bootstrap(self, request: Request, host: Any, port: Any, room: Any) -> Bootstrap | list[Bootstrap] | None:
        """A request's disaggregation fields, checked: well formed (else 400) and sent by the
        router to a peer this worker may pull from (else 403)."""
        try:
            boot = bootstrap_of(host, port, room)
        except ValueError as e:
            raise ApiError(400, str(e), param="bootstrap_host") from None
        self.gate.check(boot, caller_of(request), request.client.host if request.client else None)
        return boot

    def check_model(self, model: str | None) -> None:
        """A request may name the model; it must be the one this server serves."""
        if model is not None and model not in (self.model_name, self.model_path, "default"):
            raise ApiError(
                404,
                f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                "invalid_request_error",
                "model",
            )

    def model_paths(self, caller: Caller) -> dict[str, str]:
        """model_path and tokenizer_path as `caller` may read them: the directories for the
        admin, the served model name for a tenant (no filesystem path reaches a tenant)."""
        if caller.admin:
            return {"model_path": self.model_path, "tokenizer_path": self.tokenizer_path}
        return {"model_path": self.model_name, "tokenizer_path": self.model_name}

    def server_info(self, caller: Caller) -> dict[str, Any]:
        """What SGLang's /get_server_info reports that routers read (model, sizes, mode)."""
        info = self.front().info
        return {
            **self.model_paths(caller),
            "served_model_name": self.model_name,
            "is_generation": True,
            "tp_size": self.args.parallel.tp_size,
            "dp_size": 1,
            "disaggregation_mode": self.args.disagg.mode,
            "max_running_requests": self.args.scheduler.max_running_requests,
            "max_total_num_tokens": info["max_total_tokens"],
            "context_length": info["context_length"],
            "kv_cache_dtype": info["kv_cache_dtype"],
            "version": version("arbor"),
        }

    async def prepare(self, inputs: list[GenerateInput]) -> list[Prepared]:
        """Validate every prompt before any runs; a bad one is a 400 naming the problem. Long
        texts are tokenized on the tokenizer thread, so the event loop never stalls on them."""
        front = self.front()
        if len(inputs) > self.http.max_batch_prompts:
            raise ApiError(400, f"a batch may hold at most {self.http.max_batch_prompts} prompts, got {len(inputs)}")
        with refusing():
            if sum(len(i.text or "") for i in inputs) <= INLINE_TOKENIZE_CHARS:
                return front.prepare_batch(inputs)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.tokenizer_thread, front.prepare_batch, inputs)

    async def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, tenant: str | None = None
    ) -> list[int]:
        """Token ids of `tenant`'s chat prompt (with the tools the template renders): refused
        before the template when it surely cannot fit, tokenized on the tokenizer thread when long."""
        front = self.front()
        chars = sum(len(m["content"]) for m in messages) + (len(json.dumps(tools)) if tools else 0)
        most = front.info["context_length"] * front.max_token_chars
        with refusing("messages"):
            if chars > most:
                raise ValueError(
                    f"the messages hold {chars} characters, more than {most}, which cannot fit the "
                    f"context length of {front.info['context_length']} tokens; shorten them"
                )
            if chars <= INLINE_TOKENIZE_CHARS:
                return self.chat.encode(messages, tools, tenant)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.tokenizer_thread, self.chat.encode, messages, tools, tenant)

    def check_capacity(self, count: int) -> None:
        """429 when `count` more requests would pass max_concurrent_requests (checked before a
        stream starts, so the refusal is a status code rather than an error event)."""
        limit = self.http.max_concurrent_requests
        if self.inflight + count > limit:
            raise ApiError(
                429, f"the server is at its limit of {limit} concurrent requests; retry shortly", "rate_limit_error"
            )

    @contextlib.contextmanager
    def admit(self, count: int):
        """Count requests in flight; refuse with 429 beyond max_concurrent_requests."""
        self.check_capacity(count)
        self.inflight += count
        try:
            yield
        finally:
            self.inflight -= count

    def outputs(self, prepared: Prepared) -> AsyncIterator[GenerateOutput]:
        """A request's outputs, counted in the metrics and in its tenant's usage."""
        timed = self.metrics.timed(self.front().run(prepared), prepared.msg.stream)
        return self.usage.counted(timed, prepared.owner)

    async def render_metrics(self) -> bytes:
        """The Prometheus exposition of the whole server (every tenant's traffic)."""
        return self.metrics.render(await self.front().stats())

    async def collect(self, request: Request, prepared: list[Prepared]) -> list[list[GenerateOutput]]:
        """Run requests to completion; if the client goes away first, abort them all at once."""

        async def one(p: Prepared) -> list[GenerateOutput]:
            outs = [out async for out in self.outputs(p)]
            return sorted(outs, key=lambda o: o.index or 0)

        with self.admit(len(prepared)):
            task = asyncio.ensure_future(asyncio.gather(*(one(p) for p in prepared)))
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return _result(task)
                if await request.is_disconnected():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
                    raise ApiError(499, "the client disconnected")


def _result(task: asyncio.Future[Any]) -> Any:
    try:
        return task.result()
    except (EngineDead, ValueError) as e:  # e.g. a request id already in flight, a constraint that failed
        raise _api_error(e) from None


def _api_error(e: Exception) -> ApiError:
    """The HTTP error for what a request's run raised: a dead engine is a 503, a refusal its
    own status (400 by default)."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, EngineDead):
        return ApiError(503, str(e), "server_error")
    return ApiError(getattr(e, "status", 400), str(e))


async def read_body(request: Request, kind: type, http: HttpArgs) -> Any:
    """The request body decoded into `kind`, refusing bodies over --max-body-bytes with 413, and
    with 408 a body whose next piece takes longer than --body-timeout-s or whose whole takes
    longer than --body-deadline-s (so a slow trickle cannot hold a connection for ever)."""
    limit, timeout_s = http.max_body_bytes, http.body_timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + http.body_deadline_s
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body has {declared} bytes; the limit is {limit} (--max-body-bytes)")
    chunks, size = [], 0
    stream = request.stream()
    while True:
        left = deadline - loop.time()
        try:
            chunk = await asyncio.wait_for(anext(stream), min(timeout_s, left))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            if left <= timeout_s:
                raise ApiError(
                    408, f"the body took over {http.body_deadline_s:g} s in all (--body-deadline-s); send it at once"
                ) from None
            raise ApiError(408, f"the body stalled for {timeout_s:g} s (--body-timeout-s); send it at once") from None
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over the limit of {limit} bytes (--max-body-bytes)")
        chunks.append(chunk)
    return decode(b"".join(chunks), kind)


async def sse(events: AsyncGenerator[dict[str, Any], None], done: bool = True) -> StreamingResponse:
    """Server-sent events: each item one `data:` line of JSON; `data: [DONE]` at the end.
    The first event is awaited before the response starts, so a request refused before it
    (a constraint that does not compile, a budget below its minimum) is an HTTP error, not a
    200 stream. An error after the stream started is sent as a final event with an `error`
    object."""
    try:
        first = await anext(events)
    except StopAsyncIteration:
        first = None
    except (ApiError, EngineDead, ValueError) as e:
        await events.aclose()
        raise _api_error(e) from None

    async def body() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                yield b"data: " + json.dumps(first, ensure_ascii=False).encode() + b"\n\n"
            async for event in events:
                yield b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"
        except (ApiError, EngineDead, ValueError) as e:
            yield b"data: " + json.dumps(_api_error(e).body()).encode() + b"\n\n"
        if done:
            yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def caller_of(request: Request) -> Caller:
    """Who sent `request` (set by the auth check; an open server has one all-powerful caller)."""
    return getattr(request.state, "caller", OPEN)
