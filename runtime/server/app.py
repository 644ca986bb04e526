"""The ASGI app: lifespan (start and stop the runtime), auth, body limits, native routes.

The OpenAI routes live in `openai_api.py` and share `ServerState` and the helpers here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from arbor.runtime.config import ServerArgs
from arbor.runtime.processes import ChildProcesses
from arbor.runtime.server.chat import ChatTokenizer, role_markers
from arbor.runtime.server.errors import ApiError, decode
from arbor.runtime.server.metrics import Metrics
from arbor.runtime.server.protocol import AbortRequest, GenerateRequest
from arbor.runtime.tokenizer_manager import EngineDead, GenerateInput, Prepared, TokenizerManager

logger = logging.getLogger("arbor.server")
DISCONNECT_POLL_S = 0.25
START_TIMEOUT_S = 600.0


class ServerState:
    """Everything the routes share: the front door, the tokenizer, metrics, limits."""

    def __init__(self, args: ServerArgs) -> None:
        from transformers import AutoTokenizer

        from arbor.runtime.model.model_config import ModelConfig
        from arbor.runtime.tiny_model import builtin_model_path

        self.args = args
        self.model_path = args.model_path or str(builtin_model_path())
        ModelConfig.from_dir(self.model_path)  # a bad checkpoint fails before any process starts
        self.tokenizer_path = args.tokenizer_path or self.model_path
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, local_files_only=True)
        self.model_name = args.served_model_name or Path(self.model_path).name
        self.chat = ChatTokenizer(self.tokenizer)
        self.metrics = Metrics()
        self.children = ChildProcesses(args, self.model_path, self.tokenizer_path)
        self.manager: TokenizerManager | None = None
        self.inflight = 0
        # Each API key gets its own cache namespace; the request's cache_salt refines it.
        self.key_salt = hashlib.sha256(args.api_key.encode()).hexdigest()[:16] if args.api_key else None

    async def start(self) -> None:
        self.manager = TokenizerManager(self.args, self.tokenizer, self.children)
        self.children.start()
        try:
            await self.manager.start(START_TIMEOUT_S)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        if self.manager is not None:
            with contextlib.suppress(Exception):
                await self.manager.shutdown()
        await asyncio.get_running_loop().run_in_executor(None, self.children.stop)

    def front(self) -> TokenizerManager:
        if self.manager is None or self.manager.dead is not None:
            reason = self.manager.dead if self.manager is not None else "the server is starting"
            raise ApiError(503, f"the runtime is not available: {reason}", "server_error")
        return self.manager

    def salt(self, cache_salt: str | None) -> str | None:
        if cache_salt is not None and (not isinstance(cache_salt, str) or len(cache_salt) > 256):
            raise ApiError(400, "cache_salt must be a string of at most 256 characters", param="cache_salt")
        parts = [p for p in (self.key_salt, cache_salt) if p]
        return ":".join(parts) or None

    def prepare(self, inputs: list[GenerateInput]) -> list[Prepared]:
        """Validate every prompt before any runs; a bad one is a 400 naming the problem."""
        front = self.front()
        if len(inputs) > self.args.max_batch_prompts:
            raise ApiError(400, f"a batch may hold at most {self.args.max_batch_prompts} prompts, got {len(inputs)}")
        try:
            return [front.prepare(one) for one in inputs]
        except ValueError as e:
            raise ApiError(400, str(e)) from None

    def check_capacity(self, count: int) -> None:
        """429 when `count` more requests would pass max_concurrent_requests (checked before a
        stream starts, so the refusal is a status code rather than an error event)."""
        limit = self.args.max_concurrent_requests
        if self.inflight + count > limit:
            raise ApiError(429, f"the server is at its limit of {limit} concurrent requests; retry shortly",
                           "rate_limit_error")

    @contextlib.contextmanager
    def admit(self, count: int):
        """Count requests in flight; refuse with 429 beyond max_concurrent_requests."""
        self.check_capacity(count)
        self.inflight += count
        try:
            yield
        finally:
            self.inflight -= count

    def outputs(self, prepared: Prepared) -> AsyncIterator[dict[str, Any]]:
        return self.metrics.timed(self.front().run(prepared), prepared.msg.stream)

    async def collect(self, request: Request, prepared: list[Prepared]) -> list[list[dict[str, Any]]]:
        """Run requests to completion; if the client goes away first, abort them all at once."""
        async def one(p: Prepared) -> list[dict[str, Any]]:
            outs = [out async for out in self.outputs(p)]
            return sorted(outs, key=lambda o: o.get("index", 0))

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
    except EngineDead as e:
        raise ApiError(503, str(e), "server_error") from None


async def read_body(request: Request, kind: type, limit: int) -> Any:
    """The request body decoded into `kind`, refusing bodies over `limit` bytes with 413."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body has {declared} bytes; the limit is {limit} (--max-body-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over the limit of {limit} bytes (--max-body-bytes)")
        chunks.append(chunk)
    return decode(b"".join(chunks), kind)


def sse(events: AsyncIterator[dict[str, Any]], done: bool = True) -> StreamingResponse:
    """Server-sent events: each item one `data:` line of JSON; `data: [DONE]` at the end.
    An error after the stream started is sent as a final event with an `error` object."""
    async def body() -> AsyncIterator[bytes]:
        try:
            async for event in events:
                yield b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"
        except ApiError as e:
            yield b"data: " + json.dumps(e.body()).encode() + b"\n\n"
        except EngineDead as e:
            yield b"data: " + json.dumps(ApiError(503, str(e), "server_error").body()).encode() + b"\n\n"
        if done:
            yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def generate_inputs(body: GenerateRequest, salt: str | None) -> tuple[list[GenerateInput], bool]:
    """GenerateInputs of a native request, and whether it held a single prompt."""
    if (body.text is None) == (body.input_ids is None):
        raise ApiError(400, "give exactly one of text or input_ids")
    if isinstance(body.text, str):
        texts: list[Any] = [body.text]
        ids: list[Any] = [None]
        single = True
    elif body.text is not None:
        texts, ids, single = list(body.text), [None] * len(body.text), False
    elif body.input_ids and all(isinstance(x, list) for x in body.input_ids):
        texts, ids, single = [None] * len(body.input_ids), list(body.input_ids), False
    else:
        texts, ids, single = [None], [body.input_ids], True
    if not texts:
        raise ApiError(400, "the batch is empty; give at least one prompt")
    params = body.sampling_params
    if isinstance(params, list) and len(params) != len(texts):
        raise ApiError(400, f"sampling_params has {len(params)} entries for {len(texts)} prompts")
    rids = body.rid if isinstance(body.rid, list) else [body.rid] * len(texts)
    if len(rids) != len(texts) or (isinstance(body.rid, str) and not single):
        raise ApiError(400, f"rid must be one string per prompt ({len(texts)} prompts)")
    inputs = [
        GenerateInput(
            text=t, input_ids=i, sampling_params=params[k] if isinstance(params, list) else params,
            stream=body.stream, return_logprob=body.return_logprob, logprob_start_len=body.logprob_start_len,
            top_logprobs_num=body.top_logprobs_num, return_text_in_logprobs=body.return_text_in_logprobs,
            cache_salt=salt, rid=rids[k],
        )
        for k, (t, i) in enumerate(zip(texts, ids))
    ]
    return inputs, single


def create_app(args: ServerArgs) -> FastAPI:
    """The ASGI app; the runtime processes start with its lifespan."""
    state = ServerState(args)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        logger.info("serving %s on http://%s:%d", state.model_path, args.host, args.port)
        yield
        await state.stop()

    app = FastAPI(title="Arbor", lifespan=lifespan)
    app.state.arbor = state

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(EngineDead)
    async def engine_dead(request: Request, exc: EngineDead) -> JSONResponse:
        return JSONResponse(ApiError(503, str(exc), "server_error").body(), status_code=503)

    @app.get("/health")
    async def health() -> Response:
        state.front()
        return JSONResponse({"status": "ok"})

    guarded = APIRouter(dependencies=[Depends(_auth(args.api_key))])
    _native_routes(guarded, state)
    from arbor.runtime.server.openai_api import openai_routes

    openai_routes(guarded, state)
    app.include_router(guarded)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
    async def unknown(path: str) -> Response:
        raise ApiError(404, f"no route /{path}; see /docs for the routes this server has", "not_found_error")

    return app


def _auth(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    async def check(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        if header != f"Bearer {api_key}":
            raise ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                           "authentication_error")
    return check


def _native_routes(router: APIRouter, state: ServerState) -> None:
    limit = state.args.max_body_bytes

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        body = await read_body(request, GenerateRequest, limit)
        inputs, single = generate_inputs(body, state.salt(body.cache_salt))
        if body.stream and not single:
            raise ApiError(400, "stream takes a single prompt; send one request per prompt to stream several")
        prepared = state.prepare(inputs)
        if body.stream:
            state.check_capacity(1)
            return sse(_admitted(state, state.outputs(prepared[0])))
        results = [out for outs in await state.collect(request, prepared) for out in outs]
        return JSONResponse(results[0] if single and len(results) == 1 else results)

    @router.get("/get_model_info")
    async def model_info() -> Response:
        front = state.front()
        return JSONResponse({"model_path": state.model_path, "tokenizer_path": state.tokenizer_path,
                             "served_model_name": state.model_name, "is_generation": True,
                             "chat_roles": role_markers(state.tokenizer), **front.info})

    @router.post("/flush_cache")
    async def flush_cache() -> Response:
        stats = await state.front().flush_cache()
        return JSONResponse({"message": "cache flushed", "cached_tokens": stats.get("cache_tokens", 0)})

    @router.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await read_body(request, AbortRequest, limit)
        await state.front().abort(body.rid)
        return JSONResponse({"message": f"abort sent for {body.rid}"})

    @router.get("/get_server_info")
    async def server_info() -> Response:
        stats = await state.front().stats()
        return JSONResponse({"stats": stats, "inflight": state.inflight})

    @router.get("/metrics")
    async def metrics() -> Response:
        stats = await state.front().stats()
        return Response(state.metrics.render(stats), media_type="text/plain; version=0.0.4")


async def _admitted(state: ServerState, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """A stream counted against max_concurrent_requests while it runs."""
    with state.admit(1):
        async for event in events:
            yield event
