"""Request bodies of every route, as msgspec Structs: types are checked on decode, unknown
fields are refused (so a misspelt parameter is an error, not silently ignored)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class GenerateRequest(_Body):
    """POST /generate (SGLang-native)."""

    text: str | list[str] | None = None
    input_ids: list[Any] | None = None  # token ids, or a list of such lists (a batch)
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    cache_salt: str | None = None


class AbortRequest(_Body):
    rid: str


class StreamOptions(_Body):
    include_usage: bool = False


class _OpenAISampling(_Body, kw_only=True):
    """Fields /v1/completions and /v1/chat/completions share (OpenAI's, then extensions)."""

    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # Arbor / SGLang extensions (the openai client's extra_body)
    top_k: int = -1
    min_p: float = 0.0
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    cache_salt: str | None = None


class CompletionRequest(_OpenAISampling, kw_only=True):
    """POST /v1/completions."""

    prompt: str | list[Any]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatCompletionRequest(_OpenAISampling, kw_only=True):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
