"""What a generation returns, typed. The HTTP routes and the Engine turn it into SGLang's
JSON shape with `to_json`, once, at the edge."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from arbor.runtime.messages import FinishReason


class LogprobEntry(NamedTuple):
    """One token's logprob, SGLang's `[logprob, token_id, text]` (text only with
    return_text_in_logprobs; logprob None for the first prompt token)."""

    logprob: float | None
    token_id: int
    text: str | None


class MetaInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Counts, the finish reason and, when asked for, logprobs of one output (cumulative in
    a stream, as SGLang's default)."""

    id: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    output_token_logprobs: list[LogprobEntry] | None = None
    output_top_logprobs: list[list[LogprobEntry]] | None = None
    output_token_logprobs_length: int | None = None
    input_token_logprobs: list[LogprobEntry] | None = None
    input_top_logprobs: list[list[LogprobEntry] | None] | None = None
    schema_check: dict[str, Any] | None = None  # schema keywords checked after generation


class GenerateOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One sample's text (cumulative in a stream) and token ids so far; `index` orders the
    n samples of one request."""

    text: str
    output_ids: list[int]
    meta_info: MetaInfo
    index: int | None = None

    @property
    def finished(self) -> bool:
        return self.meta_info.finish_reason is not None

    def to_json(self) -> dict[str, Any]:
        """SGLang's JSON shape: `{text, output_ids, meta_info: {..., finish_reason: {type...}}}`."""
        return msgspec.to_builtins(self)
