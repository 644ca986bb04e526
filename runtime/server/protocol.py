"""Request bodies of every route, as msgspec Structs, field for field with SGLang 0.5.

Each SGLang field is one of three kinds (docs/sglang_fields.md lists them all):
honoured (Arbor implements it), advisory (accepted with any value; it steers nothing
Arbor has, such as log labels or a DP rank hint), or default-only (not implemented: a
request must leave it at SGLang's default, else a 400 names it). A field in neither
schema is refused, so a typo is an error rather than silently ignored.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, Literal

import msgspec

from arbor.runtime.server.errors import ApiError


class _Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ADVISORY: ClassVar[tuple[str, ...]] = ()
    DEFAULT_ONLY: ClassVar[tuple[str, ...]] = ()

    def refuse_unsupported(self) -> None:
        """400 for the first default-only field set to anything but its default (or null)."""
        defaults = _defaults(type(self))
        for name in self.DEFAULT_ONLY:
            value, default = getattr(self, name), defaults[name]
            if value is None or value == default:
                continue
            if name == "custom_logit_processor":
                raise ApiError(
                    400,
                    "custom_logit_processor carries Python code; Arbor never runs code a "
                    "client sends. Remove the field",
                    param=name,
                )
            raise ApiError(
                400,
                f"{name} is not supported by Arbor (got {_short(value)}); omit it or send its default {default!r}",
                param=name,
            )


@functools.cache
def _defaults(kind: type) -> dict[str, Any]:
    """Field defaults of a body Struct, computed once (msgspec resolves annotations each call)."""
    return {f.name: f.default for f in msgspec.structs.fields(kind)}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# SGLang GenerateReqInput fields that no Arbor feature reads.
_GENERATE_ADVISORY = (
    "log_metrics",
    "no_logs",
    "custom_labels",
    "received_time",
    "external_trace_header",
    "routing_key",
    "conversation_id",
    "priority",
)
_GENERATE_DEFAULT_ONLY = (
    "session_id",
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "mm_hashes",
    "mm_content_hashes",
    "use_audio_in_video",
    "video_config",
    "watermark",
    "token_ids_logprob",
    "return_sampling_mask",
    "sampling_logprobs_mode",
    "return_flat_raw_top_logprobs",
    "return_flat_raw_output_top_logprobs",
    "return_flat_raw_top_logprobs_b64",
    "return_hidden_states",
    "return_routed_experts",
    "routed_experts_start_len",
    "return_indexer_topk",
    "modalities",
    "session_params",
    "lora_path",
    "lora_id",
    "custom_logit_processor",
    "positional_embed_overrides",
    "bootstrap_pair_key",
    "decode_tp_size",
    "routed_dp_rank",
    "data_parallel_rank",
    "disagg_prefill_dp_rank",
    "http_worker_ipc",
    "background",
    "max_thinking_tokens",
    "return_bytes",
    "return_entropy",
    "return_prompt_token_ids",
    "need_wait_for_mm_inputs",
    "num_items_assigned",
    "encoder_urls",
    "max_dynamic_patch",
    "min_dynamic_patch",
    "image_max_dynamic_patch",
    "video_max_dynamic_patch",
    "images_config",
    "mm_processor_kwargs",
    "multi_item_delimiter_indices",
    "token_indices_to_pool",
    "kv_hints",
)


class GenerateRequest(_Body):
    """POST /generate: SGLang's GenerateReqInput. Batches give lists (one entry per prompt)."""

    ADVISORY = _GENERATE_ADVISORY
    DEFAULT_ONLY = _GENERATE_DEFAULT_ONLY

    # honoured
    text: str | list[str] | None = None
    input_ids: list[Any] | None = None  # token ids, or a list of such lists (a batch)
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    rid: str | list[str] | None = None
    cache_salt: str | None = None
    extra_key: str | list[str] | None = None  # SGLang's other cache namespace; joined to cache_salt
    model: str | None = None  # the router adds it; must name this server's model when given
    require_reasoning: bool = False  # with --reasoning-parser: the constraint starts after the reasoning
    # advisory
    log_metrics: Any = True
    no_logs: Any = False
    custom_labels: Any = None
    received_time: Any = None
    external_trace_header: Any = None
    routing_key: Any = None
    conversation_id: Any = None
    priority: Any = None
    # default-only
    session_id: Any = None
    input_embeds: Any = None
    image_data: Any = None
    video_data: Any = None
    audio_data: Any = None
    mm_hashes: Any = None
    mm_content_hashes: Any = None
    use_audio_in_video: Any = False
    video_config: Any = None
    watermark: Any = None
    token_ids_logprob: Any = None
    return_sampling_mask: Any = None
    sampling_logprobs_mode: Any = None
    return_flat_raw_top_logprobs: Any = False
    return_flat_raw_output_top_logprobs: Any = False
    return_flat_raw_top_logprobs_b64: Any = False
    return_hidden_states: Any = False
    return_routed_experts: Any = False
    routed_experts_start_len: Any = 0
    return_indexer_topk: Any = False
    modalities: Any = None
    session_params: Any = None
    lora_path: Any = None
    lora_id: Any = None
    custom_logit_processor: Any = None
    positional_embed_overrides: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    bootstrap_pair_key: Any = None
    decode_tp_size: Any = None
    routed_dp_rank: Any = None
    data_parallel_rank: Any = None
    disagg_prefill_dp_rank: Any = None
    http_worker_ipc: Any = None
    background: Any = False
    max_thinking_tokens: Any = None
    return_bytes: Any = False
    return_entropy: Any = False
    return_prompt_token_ids: Any = False
    need_wait_for_mm_inputs: Any = None
    num_items_assigned: Any = None
    encoder_urls: Any = None
    max_dynamic_patch: Any = None
    min_dynamic_patch: Any = None
    image_max_dynamic_patch: Any = None
    video_max_dynamic_patch: Any = None
    images_config: Any = None
    mm_processor_kwargs: Any = None
    multi_item_delimiter_indices: Any = None
    token_indices_to_pool: Any = None
    kv_hints: Any = None


class AbortRequest(_Body):
    rid: str


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


_OPENAI_DEFAULT_ONLY = (
    "logit_bias",
    "return_hidden_states",
    "return_routed_experts",
    "routed_experts_start_len",
    "return_cached_tokens_details",
    "return_spec_tokens_details",
    "return_token_ids",
    "lora_path",
    "session_id",
    "session_params",
    "custom_params",
    "custom_logit_processor",
    "watermark",
    "images_config",
    "mm_processor_kwargs",
    "data_parallel_rank",
    "routed_dp_rank",
    "disagg_prefill_dp_rank",
)


class _OpenAISampling(_Body, kw_only=True):
    """Fields /v1/completions and /v1/chat/completions share: OpenAI's, then SGLang's."""

    model: str = "default"
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None
    # SGLang extensions (the openai client's extra_body), honoured
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    regex: str | None = None
    ebnf: str | None = None
    rid: str | None = None
    cache_salt: str | None = None
    extra_key: str | None = None
    # advisory
    priority: Any = None
    custom_labels: Any = None
    # default-only
    logit_bias: Any = None
    return_hidden_states: Any = False
    return_routed_experts: Any = False
    routed_experts_start_len: Any = 0
    return_cached_tokens_details: Any = False
    return_spec_tokens_details: Any = False
    return_token_ids: Any = False
    lora_path: Any = None
    session_id: Any = None
    session_params: Any = None
    custom_params: Any = None
    custom_logit_processor: Any = None
    watermark: Any = None
    images_config: Any = None
    mm_processor_kwargs: Any = None
    data_parallel_rank: Any = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None
    routed_dp_rank: Any = None
    disagg_prefill_dp_rank: Any = None


class CompletionRequest(_OpenAISampling, kw_only=True):
    """POST /v1/completions."""

    ADVISORY = ("priority", "custom_labels")
    DEFAULT_ONLY = (*_OPENAI_DEFAULT_ONLY, "best_of", "suffix", "response_format")

    prompt: str | list[Any]
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    echo: bool = False
    json_schema: str | None = None
    best_of: Any = None
    suffix: Any = None
    response_format: Any = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[Any] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn: the call it answers


class ResponseFormat(_Body):
    """OpenAI's text / json_object / json_schema; SGLang's structural_tag (legacy structures and
    triggers, or xgrammar's format); grammar: an EBNF (GBNF) text in `grammar`."""

    type: Literal["text", "json_object", "json_schema", "structural_tag", "grammar"]
    json_schema: dict[str, Any] | None = None
    structures: list[Any] | None = None
    triggers: list[Any] | None = None
    at_least_one: bool = False
    format: dict[str, Any] | None = None
    grammar: str | None = None


class ChatCompletionRequest(_OpenAISampling, kw_only=True):
    """POST /v1/chat/completions. Sampling fields that SGLang leaves null take Arbor's defaults."""

    ADVISORY = ("priority", "custom_labels", "reasoning_effort")
    DEFAULT_ONLY = (
        *_OPENAI_DEFAULT_ONLY,
        "return_prompt_token_ids",
        "return_meta_info",
        "return_input_ids_in_sglext",
        "return_output_ids_in_sglext",
        "return_sampling_mask",
        "sampling_logprobs_mode",
        "return_flat_raw_output_top_logprobs",
        "thinking",
        "task",
        "continue_final_message",
        "chat_template_kwargs",
        "max_dynamic_patch",
        "min_dynamic_patch",
        "use_audio_in_video",
        "video_config",
        "input_ids",
        "return_flat_raw_top_logprobs_b64",
    )

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: Any = None  # checked by server/tools.py
    tool_choice: Any = "auto"
    parallel_tool_calls: Any = True
    stream_reasoning: bool = True  # with --reasoning-parser: stream reasoning_content as it comes
    separate_reasoning: bool = True  # with --reasoning-parser: split <think> out of content
    require_reasoning: bool = False  # with --reasoning-parser: the constraint starts after </think>
    # advisory
    reasoning_effort: Any = None
    # default-only
    return_prompt_token_ids: Any = False
    return_meta_info: Any = False
    return_input_ids_in_sglext: Any = False
    return_output_ids_in_sglext: Any = False
    return_sampling_mask: Any = False
    sampling_logprobs_mode: Any = None
    return_flat_raw_output_top_logprobs: Any = False
    return_flat_raw_top_logprobs_b64: Any = True
    thinking: Any = None
    task: Any = None
    continue_final_message: Any = False
    chat_template_kwargs: Any = None
    max_dynamic_patch: Any = None
    min_dynamic_patch: Any = None
    use_audio_in_video: Any = False
    video_config: Any = None
    input_ids: Any = None
