"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from arbor.runtime.io.generate_input import GenerateInput
from arbor.runtime.io.messages import (
    Bootstrap,
    FinishAbort,
    FinishInvalid,
    FinishLength,
    FinishStop,
)
from arbor.runtime.io.outputs import GenerateOutput, LogprobEntry, MetaInfo
from arbor.runtime.io.tokenizer_manager import Prepared
from arbor.runtime.server.chat_choice import AnswerShape, AnswerStream
from arbor.runtime.server.errors import ApiError
from arbor.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, ResponseFormat
from arbor.runtime.server.reasoning import make_reasoning_parser
from arbor.runtime.server.state import ServerState, caller_of, read_body, sse
from arbor.runtime.server.tools import plan_tools, template_message

MAX_COMPLETION_LOGPROBS = 5
MAX_CHAT_TOP_LOGPROBS = 20


def openai_routes(router: APIRouter, state: ServerState) -> None:

    @router.get("/v1/models")
    async def models(request: Request) -> Response:
        front = state.front()
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": state.model_name,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "arbor",
                        "root": state.model_paths(caller_of(request))["model_path"],
                        "max_model_len": front.info["context_length"],
                    }
                ],
            }
        )

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_body(request, CompletionRequest, state.http)
        body.refuse_unsupported()
        state.check_model(body.model)
        if body.echo:
            raise ApiError(400, "echo is not supported; send the prompt's text back yourself", param="echo")
        k = body.logprobs
        if k is not None and not 0 <= k <= MAX_COMPLETION_LOGPROBS:
            raise ApiError(400, f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}], got {k}", param="logprobs")
        prompts = _completion_prompts(body.prompt)
        params = _sampling(body, body.max_tokens, "max_tokens") | _constraint(
            regex=body.regex, json_schema=body.json_schema, ebnf=body.ebnf
        )
        caller = caller_of(request)
        salt = state.salt(caller, body.cache_salt, body.extra_key)
        rid = body.rid if len(prompts) == 1 else None
        boot = _bootstrap(state, request, body, len(prompts))
        inputs = [_input(p, params, body.stream, k, salt, rid, caller.tenant, boot) for p in prompts]
        prepared = await state.prepare(inputs)
        meta = _Meta("cmpl", state.model_name)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            state.check_capacity(len(prepared))
            return await sse(_stream_completions(state, prepared, meta, body.n, k, usage))
        results = await state.collect(request, prepared)
        choices = [
            _completion_choice(i * body.n + (o.index or 0), o, k) for i, outs in enumerate(results) for o in outs
        ]
        usage = _usage(results, state.http.enable_cache_report)
        return JSONResponse({**meta.head("text_completion"), "choices": choices, "usage": usage})

    @router.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await read_body(request, ChatCompletionRequest, state.http)
        body.refuse_unsupported()
        state.check_model(body.model)
        tools = plan_tools(body.tools, body.tool_choice, body.parallel_tool_calls, state.http.tool_call_parser)
        if (
            tools is not None
            and tools.forced
            and (body.response_format is not None or body.regex is not None or body.ebnf is not None)
        ):
            raise ApiError(
                400,
                "a required or named tool_choice constrains the answer to tool calls; drop "
                'response_format / regex / ebnf, or send tool_choice "auto"',
                param="tool_choice",
            )
        top = body.top_logprobs
        if top is not None and (not body.logprobs or not 0 <= top <= MAX_CHAT_TOP_LOGPROBS):
            raise ApiError(
                400,
                f"top_logprobs needs logprobs=true and must be in [0, {MAX_CHAT_TOP_LOGPROBS}]",
                param="top_logprobs",
            )
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        params = (
            _sampling(body, max_tokens, param)
            | _response_format(body.response_format)
            | _constraint(regex=body.regex, ebnf=body.ebnf)
            | (tools.constraint() if tools else {})
        )
        if not body.messages:
            raise ApiError(400, "messages is empty; give at least one message", param="messages")
        caller = caller_of(request)
        ids = await state.encode_chat(
            [_message(m) for m in body.messages], tools.template_tools() if tools else None, caller.tenant
        )
        k = (top or 0) if body.logprobs else None
        one = _input(
            ids,
            params,
            body.stream,
            k,
            state.salt(caller, body.cache_salt, body.extra_key),
            body.rid,
            caller.tenant,
            _bootstrap(state, request, body, 1),
        )
        # require_reasoning (with --reasoning-parser): a constraint (response_format, a forced tool
        # call) shapes the answer after the <think> section, not the reasoning.
        one.require_reasoning = body.require_reasoning
        prepared = await state.prepare([one])
        meta = _Meta("chatcmpl", state.model_name)
        reasoning = make_reasoning_parser(state.http.reasoning_parser) if body.separate_reasoning else None
        shape = AnswerShape(reasoning, tools, stream_reasoning=bool(body.stream_reasoning))
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            state.check_capacity(1)
            return await sse(_stream_chat(state, prepared[0], meta, k, usage, shape))
        results = await state.collect(request, prepared)
        for out in results[0]:
            _remember(state, out, caller.tenant)
        choices = [_chat_choice(o.index or 0, o, k, shape) for o in results[0]]
        usage = _usage(results, state.http.enable_cache_report)
        return JSONResponse({**meta.head("chat.completion"), "choices": choices, "usage": usage})


# ------------------------------------------------------------------ requests


class _Meta:
    def __init__(self, prefix: str, model: str) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def _response_format(fmt: ResponseFormat | None) -> dict[str, Any]:
    """The constraint a chat response_format asks for, as sampling params."""
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "grammar":
        if not isinstance(fmt.grammar, str) or not fmt.grammar.strip():
            raise ApiError(
                400, "response_format type grammar needs grammar: an EBNF text (root ::= ...)", param="response_format"
            )
        return {"ebnf": fmt.grammar}
    if fmt.type == "structural_tag":
        if fmt.format is not None:
            return {"structural_tag": {"type": "structural_tag", "format": fmt.format}}
        return {
            "structural_tag": {
                "type": "structural_tag",
                "structures": fmt.structures,
                "triggers": fmt.triggers,
                "at_least_one": fmt.at_least_one,
            }
        }
    spec = fmt.json_schema
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, bool)):
        raise ApiError(
            400,
            "response_format type json_schema needs json_schema: {name, schema, strict}; "
            "json_schema.schema (a JSON Schema object) is missing",
            param="response_format",
        )
    if not isinstance(spec.get("name", ""), str):
        raise ApiError(400, "response_format.json_schema.name must be a string", param="response_format")
    return {"json_schema": spec["schema"]}


def _completion_prompts(prompt: str | list[Any]) -> list[Any]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt is empty", param="prompt")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        return list(prompt)
    raise ApiError(
        400, "prompt must be a string, a list of strings, token ids, or a list of token-id lists", param="prompt"
    )


def _sampling(body: CompletionRequest | ChatCompletionRequest, max_tokens: int | None, name: str) -> dict[str, Any]:
    """Native sampling params of an OpenAI body. No max_tokens: run until the context is full
    (max_new_tokens None, which the front door settles). Null sampling fields take defaults."""
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"{name} must be >= 1, got {max_tokens}", param=name)
    return {
        "max_new_tokens": max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "seed": body.seed,
        "min_new_tokens": body.min_tokens,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "repetition_penalty": body.repetition_penalty,
        "ignore_eos": body.ignore_eos,
        "stop_token_ids": body.stop_token_ids,
        "stop": body.stop or None,
        "stop_regex": body.stop_regex or None,
        "no_stop_trim": body.no_stop_trim,
        "skip_special_tokens": body.skip_special_tokens,
        "n": body.n,
    }


def _constraint(**kinds: str | None) -> dict[str, Any]:
    return {kind: value for kind, value in kinds.items() if value is not None}


def _input(
    prompt: Any,
    params: dict[str, Any],
    stream: bool,
    k: int | None,
    salt: str | None,
    rid: str | None,
    owner: str | None,
    boot: Bootstrap | None,
) -> GenerateInput:
    text, ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
    return GenerateInput(
        text=text,
        input_ids=ids,
        sampling_params=dict(params),
        stream=stream,
        return_logprob=k is not None,
        top_logprobs_num=k or 0,
        return_text_in_logprobs=k is not None,
        cache_salt=salt,
        rid=rid,
        owner=owner,
        bootstrap=boot,
    )


def _bootstrap(state: ServerState, request: Request, body: Any, prompts: int) -> Bootstrap | None:
    """The request's disaggregation fields (sglang-router --pd-disaggregation adds them)."""
    boot = state.bootstrap(request, body.bootstrap_host, body.bootstrap_port, body.bootstrap_room)
    if boot is not None and (isinstance(boot, list) or prompts > 1):
        raise ApiError(400, "a disaggregated request carries one prompt; send one request per prompt")
    return boot


def _message(m: Any) -> dict[str, Any]:
    content = m.content
    if isinstance(content, list):
        if not all(part.get("type") == "text" and isinstance(part.get("text"), str) for part in content):
            raise ApiError(400, "only text content parts are supported", param="messages")
        content = "".join(part["text"] for part in content)
    return template_message(m, content or "")


def _remember(state: ServerState, out: GenerateOutput, tenant: str | None) -> None:
    """Keep the ids behind `tenant`'s assistant answer, so its next turn's prompt reuses its KV."""
    reason = out.meta_info.finish_reason
    ids = out.output_ids
    if isinstance(reason, FinishStop) and isinstance(reason.matched, int) and ids and ids[-1] == reason.matched:
        ids = ids[:-1]  # the template writes the end-of-turn token itself
    elif not isinstance(reason, FinishLength):
        return  # cut by a stop string: text and ids no longer line up
    state.chat.remember(out.text, ids, tenant)


# ----------------------------------------------------------------- responses


def _finish_reason(meta: MetaInfo) -> str | None:
    reason = meta.finish_reason
    if reason is None:
        return None
    if isinstance(reason, FinishAbort):
        raise ApiError(
            reason.status_code, reason.message, "server_error" if reason.status_code >= 500 else "invalid_request_error"
        )
    if isinstance(reason, FinishInvalid):
        return "invalid"  # the output breaks its schema (meta_info.schema_check says how)
    return "length" if isinstance(reason, FinishLength) else "stop"


def _usage(results: list[list[GenerateOutput]], cache_report: bool) -> dict[str, Any]:
    prompt = sum(outs[0].meta_info.prompt_tokens for outs in results)
    completion = sum(o.meta_info.completion_tokens for outs in results for o in outs)
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cache_report:  # --enable-cache-report: how much of the prompt was cached is a side channel
        usage["prompt_tokens_details"] = {"cached_tokens": sum(outs[0].meta_info.cached_tokens for outs in results)}
    return usage


def _entries(meta: MetaInfo) -> list[tuple[LogprobEntry, list[LogprobEntry]]]:
    """Each output token's entry (in a stream: this event's tokens) with its top alternatives."""
    entries = meta.output_token_logprobs or []
    tops = meta.output_top_logprobs or [[] for _ in entries]
    return list(zip(entries, tops))


def _completion_logprobs(meta: MetaInfo, k: int | None) -> dict[str, Any] | None:
    if k is None:
        return None
    pairs = _entries(meta)
    offsets, pos = [], 0
    for e, _ in pairs:
        offsets.append(pos)
        pos += len(e.text or "")
    return {
        "tokens": [e.text for e, _ in pairs],
        "token_logprobs": [e.logprob for e, _ in pairs],
        "top_logprobs": [{t.text: t.logprob for t in row} for _, row in pairs] if k else None,
        "text_offset": offsets,
    }


def _chat_logprobs(meta: MetaInfo, k: int | None) -> dict[str, Any] | None:
    if k is None:
        return None

    def item(e: LogprobEntry) -> dict[str, Any]:
        text = e.text or ""
        return {"token": text, "logprob": e.logprob, "bytes": list(text.encode())}

    return {"content": [{**item(e), "top_logprobs": [item(t) for t in row]} for e, row in _entries(meta)]}


def _has_logprobs(out: GenerateOutput, k: int | None) -> bool:
    return k is not None and bool(out.meta_info.output_token_logprobs)


def _completion_choice(index: int, out: GenerateOutput, k: int | None) -> dict[str, Any]:
    meta = out.meta_info
    return {
        "index": index,
        "text": out.text,
        "logprobs": _completion_logprobs(meta, k),
        "finish_reason": _finish_reason(meta),
    }


def _chat_choice(index: int, out: GenerateOutput, k: int | None, shape: AnswerShape) -> dict[str, Any]:
    meta = out.meta_info
    message, reason = shape.message(out.text, _finish_reason(meta))
    return {"index": index, "message": message, "logprobs": _chat_logprobs(meta, k), "finish_reason": reason}


async def _merged(state: ServerState, prepared: list[Prepared]) -> AsyncIterator[tuple[int, GenerateOutput]]:
    """Outputs of several requests as they come, tagged with the request's position."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(i: int, p: Prepared) -> None:
        try:
            async for out in state.outputs(p):
                await queue.put((i, out))
            await queue.put((i, end))
        except Exception as e:
            await queue.put((i, e))

    with state.admit(len(prepared)):
        tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prepared)]
        try:
            remaining = len(tasks)
            while remaining:
                i, item = await queue.get()
                if item is end:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


class _Deltas:
    """Per choice: how much text was already sent (an event's logprobs are already only its new ones)."""

    def __init__(self) -> None:
        self.text: dict[int, int] = {}

    def step(self, index: int, out: GenerateOutput) -> str:
        sent = self.text.get(index, 0)
        self.text[index] = len(out.text)
        return out.text[sent:]


async def _stream_completions(
    state: ServerState,
    prepared: list[Prepared],
    meta: _Meta,
    n: int,
    k: int | None,
    include_usage: bool,
) -> AsyncGenerator[dict[str, Any], None]:
    deltas = _Deltas()
    finals: dict[int, GenerateOutput] = {}
    async for i, out in _merged(state, prepared):
        index = i * n + (out.index or 0)
        text = deltas.step(index, out)
        reason = _finish_reason(out.meta_info)
        if reason is not None:
            finals[index] = out
        if text or reason is not None or _has_logprobs(out, k):
            choice = {
                "index": index,
                "text": text,
                "logprobs": _completion_logprobs(out.meta_info, k),
                "finish_reason": reason,
            }
            yield {**meta.head("text_completion"), "choices": [choice]}
    if include_usage:
        by_prompt = [[finals[i * n + j] for j in range(n)] for i in range(len(prepared))]
        yield {
            **meta.head("text_completion"),
            "choices": [],
            "usage": _usage(by_prompt, state.http.enable_cache_report),
        }


async def _stream_chat(
    state: ServerState,
    prepared: Prepared,
    meta: _Meta,
    k: int | None,
    include_usage: bool,
    shape: AnswerShape,
) -> AsyncGenerator[dict[str, Any], None]:
    splits: dict[int, AnswerStream] = {}
    finals: dict[int, GenerateOutput] = {}
    head = meta.head("chat.completion.chunk")
    n = prepared.msg.n
    async for _, out in _merged(state, [prepared]):
        index = out.index or 0
        if index not in splits:  # the role opens each choice, with its first output (sse awaits it)
            yield {
                **head,
                "choices": [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
        reason = _finish_reason(out.meta_info)
        split = splits.setdefault(index, AnswerStream(shape))
        delta = split.step(out.text, reason is not None)
        if delta or _has_logprobs(out, k):  # tokens without text yet still carry their logprobs
            yield {
                **head,
                "choices": [
                    {
                        "index": index,
                        "delta": delta or {"content": ""},
                        "logprobs": _chat_logprobs(out.meta_info, k),
                        "finish_reason": None,
                    }
                ],
            }
        if reason is not None:
            finals[index] = out
            _remember(state, out, prepared.owner)
            for call in split.tool_deltas():
                yield {
                    **head,
                    "choices": [
                        {"index": index, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}
                    ],
                }
            reason = split.finish(reason)
            yield {**head, "choices": [{"index": index, "delta": {}, "logprobs": None, "finish_reason": reason}]}
    if include_usage:
        yield {**head, "choices": [], "usage": _usage([[finals[i] for i in range(n)]], state.http.enable_cache_report)}
