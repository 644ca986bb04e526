"""What a generation returns, typed. The HTTP routes and the Engine turn it into SGLang's
JSON shape with `to_json`, once, at the edge."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from arbor.runtime.io.messages import FinishReason


class LogprobEntry(NamedTuple):
    """One token's logprob, SGLang's `[logprob, token_id, text]` (text only with
    return_text_in_logprobs; logprob None for the first prompt token)."""

    logprob: float | None
    token_id: int
    text: str | None


class MetaInfo(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Counts, the finish reason and, when asked for, logprobs of one output. Inside Arbor a
    stream event carries only the output logprobs new in it (StreamShaper)."""

    id: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    spec_verify_ct: int | None = None  # speculative verify steps (SGLang's field), when speculation ran
    spec_accept_len: float | None = None  # completion tokens per verify step
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


class StreamShaper:
    """Shapes one request's stream events for the client, per sample index. Cumulative (SGLang's
    default): text, ids and every output logprob so far. Incremental
    (`--incremental-streaming-output`): only what is new in each event."""

    def __init__(self, incremental: bool) -> None:
        self.incremental = incremental
        self._sent: dict[int, tuple[int, int]] = {}  # chars and ids already sent
        self._logprobs: dict[int, list[LogprobEntry]] = {}
        self._top: dict[int, list[list[LogprobEntry]]] = {}

    def __call__(self, out: GenerateOutput) -> dict[str, Any]:
        i, meta = out.index or 0, out.meta_info
        if self.incremental:
            chars, ids = self._sent.get(i, (0, 0))
            self._sent[i] = (len(out.text), len(out.output_ids))
            return msgspec.structs.replace(out, text=out.text[chars:], output_ids=out.output_ids[ids:]).to_json()
        if meta.output_token_logprobs is not None:
            entries = self._logprobs.setdefault(i, [])
            entries += meta.output_token_logprobs
            top = self._top.setdefault(i, [])
            top += meta.output_top_logprobs or []
            meta = msgspec.structs.replace(
                meta,
                output_token_logprobs=entries,
                output_top_logprobs=top if meta.output_top_logprobs is not None else None,
            )
        return msgspec.structs.replace(out, meta_info=meta).to_json()
