"""The ASGI app: lifespan (start and stop the runtime), auth, the native routes.

The OpenAI routes live in `openai_api.py`; both share `state.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.generate_input import GenerateInput, split_batch
from arbor.runtime.io.outputs import GenerateOutput, StreamShaper
from arbor.runtime.io.tokenizer_manager import EngineDead, Prepared
from arbor.runtime.server.auth import Keys
from arbor.runtime.server.chat import role_markers
from arbor.runtime.server.errors import ApiError
from arbor.runtime.server.metrics_port import metrics_listener
from arbor.runtime.server.openai_api import openai_routes
from arbor.runtime.server.openapi import install_openapi
from arbor.runtime.server.protocol import AbortRequest, GenerateRequest
from arbor.runtime.server.state import ServerState, caller_of, read_body, sse

logger = logging.getLogger("arbor.server")
METRICS_TYPE = "text/plain; version=0.0.4"
MAX_STREAMED_LOGPROBS = 1 << 18  # entries over all events of one cumulative native stream (~8 MB)


def create_app(args: ServerArgs) -> FastAPI:
    """The ASGI app; the runtime processes start with its lifespan."""
    state = ServerState(args)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with metrics_listener(args.http.metrics_port, state.render_metrics):  # a port in use fails first
            await state.start()
            logger.info("serving %s on http://%s:%d", state.model_path, args.http.host, args.http.port)
            yield
            await state.stop()

    app = FastAPI(title="Arbor", lifespan=lifespan)
    app.state.arbor = state

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        # A body refused before it was all read (too slow, too large): close the connection,
        # or the client could go on trickling into it.
        close = {"Connection": "close"} if exc.status in (408, 413) else None
        return JSONResponse(exc.body(), status_code=exc.status, headers=close)

    @app.exception_handler(EngineDead)
    async def engine_dead(request: Request, exc: EngineDead) -> JSONResponse:
        return JSONResponse(ApiError(503, str(exc), "server_error").body(), status_code=503)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        """Anything else escaping a route is Arbor's bug, never the request's: a 500 in the
        same error shape. Starlette re-raises after answering, so the log gets the traceback."""
        return JSONResponse(
            ApiError(
                500,
                "internal error: this is a bug in Arbor, not in the request; the server log has its traceback",
                "server_error",
            ).body(),
            status_code=500,
        )

    @app.get("/health")
    async def health() -> Response:
        """503 while the runtime is down or a process has stopped making progress (heartbeats)."""
        _check_progress(state)
        return JSONResponse({"status": "ok"})

    guarded = APIRouter(dependencies=[Depends(_auth(state.keys))])
    _native_routes(guarded, state)
    openai_routes(guarded, state)
    app.include_router(guarded)
    install_openapi(app, state.keys.enabled)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
    async def unknown(path: str) -> Response:
        raise ApiError(404, f"no route /{path}; see /docs for the routes this server has", "not_found_error")

    return app


def _auth(keys: Keys) -> Callable[[Request], Awaitable[None]]:
    async def check(request: Request) -> None:
        if not keys.enabled:
            return
        caller = keys.caller(request.headers.get("authorization", ""))
        if caller is None:
            raise ApiError(401, "missing or wrong API key: send `Authorization: Bearer <key>`", "authentication_error")
        request.state.caller = caller

    return check


def _check_progress(state: ServerState) -> None:
    """503 while the runtime is down or one of its processes has stopped making progress."""
    stalled = state.front().children.stalled(state.http.health_heartbeat_timeout_s)
    if stalled is not None:
        raise ApiError(503, f"the runtime is not making progress: {stalled}", "server_error")


def _admin_only(request: Request, what: str) -> None:
    """403 unless the caller holds the admin key (an open server's caller does)."""
    if not caller_of(request).admin:
        raise ApiError(
            403,
            f"{what} shows every tenant's traffic and needs the admin key (--admin-api-key-file); "
            "your own counters are in /get_server_info",
            "permission_error",
        )


def _native_routes(router: APIRouter, state: ServerState) -> None:

    @router.get("/health_generate")
    async def health_generate(request: Request) -> Response:
        """Healthy only if the engine generates: one token of a one-token prompt, greedy. It
        needs a key and counts against max_concurrent_requests, as any generation does."""
        caller = caller_of(request)
        timeout = state.http.health_heartbeat_timeout_s
        _check_progress(state)
        prepared = await state.prepare(
            [
                GenerateInput(
                    input_ids=[0],
                    sampling_params={"max_new_tokens": 1, "temperature": 0},
                    cache_salt=state.salt(caller, None),
                    owner=caller.tenant,
                )
            ]
        )

        async def one_token() -> None:
            async for _ in state.front().run(prepared[0]):
                pass

        with state.admit(1):
            try:  # a stall that begins now must not hang the probe either
                await asyncio.wait_for(one_token(), timeout)
            except asyncio.TimeoutError:
                raise ApiError(
                    503,
                    f"the engine did not generate one token within {timeout:g} s (--health-heartbeat-timeout-s)",
                    "server_error",
                ) from None
        return JSONResponse({"status": "ok"})

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        body = await read_body(request, GenerateRequest, state.http)
        body.refuse_unsupported()
        caller = caller_of(request)
        state.check_model(body.model)
        try:
            inputs, single = split_batch(
                body.text,
                body.input_ids,
                body.sampling_params,
                stream=body.stream,
                rid=body.rid,
                return_logprob=body.return_logprob,
                logprob_start_len=body.logprob_start_len,
                top_logprobs_num=body.top_logprobs_num,
                return_text_in_logprobs=body.return_text_in_logprobs,
                cache_salt=state.salt(caller, body.cache_salt, _one_key(body.extra_key)),
                owner=caller.tenant,
                bootstrap=state.bootstrap(request, body.bootstrap_host, body.bootstrap_port, body.bootstrap_room),
                require_reasoning=body.require_reasoning,
            )
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if body.stream and not single:
            raise ApiError(400, "stream takes a single prompt; send one request per prompt to stream several")
        prepared = await state.prepare(inputs)
        if body.stream:
            incremental = state.http.incremental_streaming_output
            if not incremental:
                _check_cumulative_payload(prepared[0])
            state.check_capacity(1)
            return await sse(_shaped(_admitted(state, state.outputs(prepared[0])), StreamShaper(incremental)))
        results = [out.to_json() for outs in await state.collect(request, prepared) for out in outs]
        return JSONResponse(results[0] if single and len(results) == 1 else results)

    @router.get("/get_model_info")
    @router.get("/model_info")
    async def model_info(request: Request) -> Response:
        front = state.front()
        return JSONResponse(
            {
                **state.model_paths(caller_of(request)),
                "served_model_name": state.model_name,
                "is_generation": True,
                "max_context_length": front.info["context_length"],
                "chat_roles": role_markers(state.tokenizer),
                **front.info,
            }
        )

    @router.post("/flush_cache")
    async def flush_cache(request: Request) -> Response:
        if not caller_of(request).admin:
            raise ApiError(403, "flushing the cache needs the admin key (--admin-api-key-file)", "permission_error")
        stats = await state.front().flush_cache()
        return JSONResponse({"message": "cache flushed", "cached_tokens": stats.get("cache_tokens", 0)})

    @router.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await read_body(request, AbortRequest, state.http)
        caller = caller_of(request)
        found = await state.front().abort(body.rid, caller.tenant, any_owner=caller.admin)
        message = f"abort sent for {body.rid}" if found else f"no running request of yours has rid {body.rid!r}"
        return JSONResponse({"message": message, "found": found})

    @router.get("/get_server_info")
    @router.get("/server_info")
    async def server_info(request: Request) -> Response:
        """The server's configuration, and counters: the whole server's for the admin, the
        caller's own (its finished requests and their tokens) for a tenant."""
        caller = caller_of(request)
        info = state.server_info(caller)
        if not caller.admin:
            return JSONResponse({**info, "stats": state.usage.of(caller.tenant)})
        stats = await state.front().stats()
        return JSONResponse({**info, "stats": stats, "inflight": state.inflight, "tenants": state.usage.all()})

    @router.get("/get_load")
    async def get_load(request: Request) -> Response:
        """SGLang's load report, one entry per data-parallel rank, which routers poll (with
        the admin key: the load is every tenant's traffic)."""
        if not caller_of(request).pd:  # the PD router balances on it
            _admin_only(request, "/get_load")
        stats = await state.front().stats()
        waiting = int(stats.get("waiting", 0))
        used = int(stats.get("total_slots", 0) - stats.get("free_slots", 0))
        return JSONResponse(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": int(stats.get("running", 0)) + waiting,
                    "num_waiting_reqs": waiting,
                    "num_tokens": used,
                    "ts_tic": time.perf_counter(),
                }
            ]
        )

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        _admin_only(request, "/metrics (or --metrics-port, on 127.0.0.1)")
        return Response(await state.render_metrics(), media_type=METRICS_TYPE)


async def _admitted(state: ServerState, events: AsyncIterator[GenerateOutput]) -> AsyncIterator[GenerateOutput]:
    """A stream counted against max_concurrent_requests while it runs."""
    with state.admit(1):
        async for event in events:
            yield event


async def _shaped(events: AsyncIterator[GenerateOutput], shape: StreamShaper) -> AsyncGenerator[dict[str, Any], None]:
    async for event in events:
        yield shape(event)


def _check_cumulative_payload(prepared: Prepared) -> None:
    """A cumulative stream re-sends every logprob in every event: refuse one whose events
    would carry more than MAX_STREAMED_LOGPROBS entries in all."""
    msg = prepared.msg
    if not msg.return_logprob:
        return
    tokens = msg.sampling.max_new_tokens
    entries = tokens * (tokens + 1) // 2 // prepared.stream_interval * (1 + msg.top_logprobs_num)
    if entries > MAX_STREAMED_LOGPROBS:
        raise ApiError(
            400,
            f"this stream would re-send about {entries} logprob entries (every event carries all "
            f"so far; the limit is {MAX_STREAMED_LOGPROBS}); raise stream_interval, lower "
            "max_new_tokens or top_logprobs_num, or start the server with "
            "--incremental-streaming-output",
        )


def _one_key(extra_key: str | list[str] | None) -> str | None:
    if isinstance(extra_key, list):
        if len(set(extra_key)) > 1:
            raise ApiError(400, "extra_key must be the same for every prompt of a batch", param="extra_key")
        return extra_key[0] if extra_key else None
    return extra_key
