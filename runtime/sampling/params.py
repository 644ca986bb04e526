"""SamplingParams: per-request generation settings, validated with messages that say what to change."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

INT64 = 1 << 63
GREEDY_BELOW = 1e-5  # temperatures below this sample greedily
MAX_STOP_TOKEN_IDS = 256


@dataclass
class SamplingParams:
    """How one request generates. temperature 0 is greedy; top_k <= 0 and top_p 1 disable."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    min_new_tokens: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    budget_aware: bool | None = None  # close a constrained output before the budget ends (None: on for JSON)

    def __post_init__(self) -> None:
        _check(
            _is_int(self.max_new_tokens, 0), f"max_new_tokens must be an integer >= 0, got {_r(self.max_new_tokens)}"
        )
        _check(
            _is_number(self.temperature) and self.temperature >= 0,
            f"temperature must be a finite number >= 0 (0 = greedy), got {_r(self.temperature)}",
        )
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, f"top_p must be in (0, 1], got {_r(self.top_p)}")
        _check(_is_int(self.top_k, -INT64), f"top_k must be an integer (<= 0 disables), got {_r(self.top_k)}")
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {_r(self.min_p)}")
        _check(
            _is_int(self.min_new_tokens, 0), f"min_new_tokens must be an integer >= 0, got {_r(self.min_new_tokens)}"
        )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check(_is_number(value) and -2 <= value <= 2, f"{name} must be in [-2, 2], got {_r(value)}")
        _check(
            _is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= 2,
            f"repetition_penalty must be in (0, 2] (1 = off), got {_r(self.repetition_penalty)}",
        )
        _check(self.seed is None or _is_int(self.seed, -INT64), f"seed must be a 64-bit integer, got {_r(self.seed)}")
        _check(isinstance(self.ignore_eos, bool), f"ignore_eos must be true or false, got {_r(self.ignore_eos)}")
        _check(
            self.budget_aware is None or isinstance(self.budget_aware, bool),
            f"budget_aware must be true, false or null (on for JSON), got {_r(self.budget_aware)}",
        )
        _check(
            isinstance(self.stop_token_ids, list) and all(_is_int(t, 0) for t in self.stop_token_ids),
            "stop_token_ids must be a list of token ids (integers >= 0)",
        )
        _check(
            len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
            f"stop_token_ids allows at most {MAX_STOP_TOKEN_IDS} ids, got {len(self.stop_token_ids)}",
        )
        if self.temperature < GREEDY_BELOW:  # as SGLang: a tiny temperature is greedy, not a division blow-up
            self.temperature = 0.0

    def fit_vocab(self, vocab_size: int) -> None:
        """Check token ids against the vocabulary and clamp top_k to it (top_k >= vocab = off)."""
        bad = next((t for t in self.stop_token_ids if t >= vocab_size), None)
        _check(bad is None, f"stop_token_ids holds {bad}, outside the vocabulary [0, {vocab_size})")
        if self.top_k >= vocab_size:
            self.top_k = -1

    @property
    def penalized(self) -> bool:
        """Whether any repetition penalty is on."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> SamplingParams:
        """Build from the sampling keys of a request (the front door has taken out the
        output and constraint keys). A key that holds None takes its default, as in SGLang;
        `sampling_seed` is SGLang's name for `seed`; unknown keys are an error."""
        params = {k: v for k, v in params.items() if v is not None}
        if "sampling_seed" in params:
            params.setdefault("seed", params.pop("sampling_seed"))
        for name, default in DEFAULT_ONLY.items():
            value = params.pop(name, default)
            _check(
                value == default,
                f"sampling parameter {name} is not supported by Arbor (got {_r(value)}); "
                f"omit it or send its default {_r(default)}",
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - known)
        _check(
            not unknown,
            f"unknown sampling parameter(s) {', '.join(unknown)}; "
            f"supported: {', '.join(sorted(known | FRONT_DOOR_KEYS))}",
        )
        return cls(**params)


# SGLang SamplingParams fields Arbor does not implement: accepted only at their defaults.
DEFAULT_ONLY: dict[str, Any] = {
    "beam_width": None,
    "logit_bias": None,
    "custom_params": None,
    "watermark": None,
    "stop_strs": None,
    "stop_regex_strs": None,
    "stop_str_max_len": 0,
    "stop_regex_max_len": 0,
    "is_normalized": False,
    "ebnf_full_assistant": False,
}
# Keys the front door takes out before `from_dict`: output options, n, constraints.
FRONT_DOOR_KEYS = {
    "stop",
    "stop_regex",
    "no_stop_trim",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "stream_interval",
    "n",
    "regex",
    "json_schema",
    "choices",
    "json_object",
    "ebnf",
    "structural_tag",
    "sampling_seed",
}


def _is_number(x: Any) -> bool:
    """A finite float, or an int within int64 (NaN, inf and huge ints are refused)."""
    if isinstance(x, float):
        return math.isfinite(x)
    return isinstance(x, int) and not isinstance(x, bool) and -INT64 <= x < INT64


def _r(value: Any) -> str:
    """repr, cut short: an error message never echoes a huge value back."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(x: Any, low: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x < INT64


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
