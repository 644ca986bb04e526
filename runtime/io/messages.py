"""Every message that crosses a process boundary, as tagged msgspec Structs (never pickle).

Token ids travel as int32 bytes (`pack_ids` / `unpack_ids`): one memcpy each way, and the
scheduler can use them as radix keys directly.
"""

from __future__ import annotations

from array import array
from typing import Any

import msgspec

from arbor.grammar.constraint import Constraint
from arbor.runtime.sampling.params import SamplingParams


def pack_ids(ids: list[int] | array) -> bytes:
    """Token ids as int32 bytes."""
    return ids.tobytes() if isinstance(ids, array) else array("i", ids).tobytes()


def unpack_ids(data: bytes) -> array:
    """int32 bytes back to an `array('i')`."""
    return array("i", data)


class _Msg(msgspec.Struct, tag=True, kw_only=True):
    """Base: the class name is the wire tag, so one Union decoder can route every type."""


# ---------------------------------------------------------------- finish reasons


class _Finish(msgspec.Struct, tag_field="type", kw_only=True, frozen=True):
    """Why a request ended (SGLang's FINISH_* family); JSON as `{"type": ..., ...}`."""


class FinishStop(_Finish, tag="stop", frozen=True):
    """EOS or a stop token (`matched` its id), a stop string or regex (the text), or a
    grammar that completed (None)."""

    matched: int | str | None = None


class FinishLength(_Finish, tag="length", frozen=True):
    """max_new_tokens (or the context) ran out after `length` tokens."""

    length: int


class FinishAbort(_Finish, tag="abort", frozen=True):
    """Ended early: aborted, refused, or failed; `status_code` is the HTTP code it maps to."""

    message: str = "aborted"
    status_code: int = 500


class FinishInvalid(_Finish, tag="invalid", frozen=True):
    """The grammar completed, but the output breaks a schema keyword that is only checked
    after generation; `message` says which and how. Never reported as `stop`."""

    message: str


FinishReason = FinishStop | FinishLength | FinishAbort | FinishInvalid


class OutputOptions(msgspec.Struct, kw_only=True, frozen=True):
    """How a request's tokens become text: stop strings and regexes, and decode flags."""

    stop: list[str] = []
    stop_regex: list[str] = []
    stop_regex_max_len: int = 0  # longest text a stop regex can match (capped), held back in streams
    no_stop_trim: bool = False  # keep the matched stop string or token in the output
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    @property
    def scans_text(self) -> bool:
        """Whether the detokenizer must see every step's text (to find a stop)."""
        return bool(self.stop or self.stop_regex)


# ------------------------------------------------------------ front -> scheduler


class Bootstrap(msgspec.Struct, kw_only=True, frozen=True):
    """Where a disaggregated request's KV comes from: the prefill worker's bootstrap socket and
    the room (sglang-router's bootstrap_host, bootstrap_port, bootstrap_room) pairing the two halves."""

    host: str
    port: int
    room: int


class ReasoningMarkers(msgspec.Struct, frozen=True):
    """The reasoning section's marker token ids: the request's constraint starts after the end
    marker (grammar/reasoning_gate.py). opens_inside: the answer starts inside the section."""

    start_ids: list[int]
    end_ids: list[int]
    opens_inside: bool = False


class TokenizedGenerateReq(_Msg):
    """One generation request, tokenized. `n` samples share one prefill of the prompt."""

    rid: str
    input_ids: bytes
    sampling: SamplingParams
    n: int = 1
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1  # >= 0: also return prompt logprobs from this position
    top_logprobs_num: int = 0
    cache_salt: str | None = None
    output: OutputOptions = OutputOptions()
    constraint: Constraint | None = None  # json_schema / regex / choices / json_object / ebnf / structural_tag
    reasoning: ReasoningMarkers | None = None  # the constraint applies after the reasoning section
    bootstrap: Bootstrap | None = None  # prefill/decode disaggregation


class AbortReq(_Msg):
    """Stop a request by its exact rid and free its KV."""

    rid: str


class FlushCacheReq(_Msg):
    """Drop every unlocked prefix from the radix cache."""


class ShutdownReq(_Msg):
    """Ask a process to exit its loop."""


# ------------------------------------------------------ scheduler -> detokenizer


class ReqOut(msgspec.Struct, kw_only=True):
    """New tokens of one request in one step; `finish_reason` set on its last output."""

    rid: str
    new_ids: bytes
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec_verify_ct: int = 0  # speculative verify steps so far
    logprobs: list[float] = []
    top_logprobs: list[list[tuple[float, int]]] = []
    input_logprobs: list[float] = []  # prompt positions logprob_start_len.. (position 0 excluded)
    input_top_logprobs: list[list[tuple[float, int]]] = []
    output: OutputOptions = OutputOptions()


class BatchTokenOut(_Msg):
    """Everything one scheduler step produced."""

    outs: list[ReqOut]


class Ready(_Msg):
    """Start-up handshake: a process is up; `info` carries sizes the front door reports."""

    process: str
    info: dict[str, Any] = {}


class ProcessError(_Msg):
    """A child failed (at start-up or in its loop); the front door fails every waiter."""

    process: str
    message: str


class Stats(_Msg):
    """Scheduler counters for /metrics and tests (answer to a `StatsReq`)."""

    values: dict[str, float]


class StatsReq(_Msg):
    """Ask the scheduler for its counters (it answers with `Stats` down the ring)."""


# ------------------------------------------------------ detokenizer -> front door


class TextOut(msgspec.Struct, kw_only=True):
    """New text of one request: `text` is the increment, `output_ids` the new ids."""

    rid: str
    text: str
    output_ids: list[int]
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    spec_verify_ct: int = 0
    logprobs: list[float] = []
    top_logprobs: list[list[tuple[float, int]]] = []
    input_logprobs: list[float] = []
    input_top_logprobs: list[list[tuple[float, int]]] = []


class BatchTextOut(_Msg):
    """Detokenized outputs of one scheduler step."""

    outs: list[TextOut]


ToScheduler = TokenizedGenerateReq | AbortReq | FlushCacheReq | StatsReq | ShutdownReq
ToDetokenizer = BatchTokenOut | Ready | Stats | ShutdownReq
ToFront = BatchTextOut | Ready | ProcessError | Stats
