"""One request as the front door receives it, and the one place a batch is split into prompts.

The native `/generate` route and `Engine.generate` both call `split_batch`; the
TokenizerManager validates each prompt; the scheduler trusts what it receives.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from arbor.runtime.io.messages import Bootstrap

PER_PROMPT = ("return_logprob", "logprob_start_len", "top_logprobs_num", "rid", "bootstrap")


@dataclass
class GenerateInput:
    """One prompt (text or token ids, never both) with its options."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    cache_salt: str | None = None
    rid: str | None = None
    owner: str | None = None  # the tenant (API key) that sent it; rids are per owner
    bootstrap: Bootstrap | None = None  # prefill/decode disaggregation: sglang-router's bootstrap fields
    require_reasoning: bool = False  # the output opens with a reasoning section; constrain what follows


def split_batch(text: Any, input_ids: Any, sampling_params: Any, **options: Any) -> tuple[list[GenerateInput], bool]:
    """GenerateInputs of a single or batched request, and whether it held a single prompt.

    `sampling_params`, and the options in PER_PROMPT, may be one value for every prompt or a
    list with one per prompt (as SGLang allows); None means the option's default. Raises
    ValueError naming what to change."""
    if (text is None) == (input_ids is None):
        raise ValueError("give exactly one of text (a prompt string) or input_ids (token ids)")
    texts: list[str | None]
    ids: list[list[int] | None]
    if isinstance(text, str):
        texts, ids, single = [text], [None], True
    elif text is not None:
        if not isinstance(text, list) or not all(isinstance(t, str) for t in text):
            raise ValueError("text must be a string or a list of strings")
        texts, ids, single = list(text), [None] * len(text), False
    elif isinstance(input_ids, list) and input_ids and all(isinstance(x, list) for x in input_ids):
        texts, ids, single = [None] * len(input_ids), list(input_ids), False
    else:
        texts, ids, single = [None], [input_ids], True
    if not texts:
        raise ValueError("the batch is empty; give at least one prompt")
    count = len(texts)
    per = {
        name: _per_prompt(name, value, count, single)
        for name, value in {"sampling_params": sampling_params, **options}.items()
    }
    inputs = []
    for k in range(count):
        fields = {name: values[k] for name, values in per.items() if values[k] is not None}
        inputs.append(GenerateInput(text=texts[k], input_ids=ids[k], **fields))
    return inputs, single


def _per_prompt(name: str, value: Any, count: int, single: bool) -> list[Any]:
    if isinstance(value, list) and (name == "sampling_params" or name in PER_PROMPT):
        if len(value) != count:
            raise ValueError(f"{name} has {len(value)} entries for {count} prompts; give one per prompt")
        return value
    if name == "rid" and value is not None and not single:
        raise ValueError(f"rid must be a list with one string per prompt ({count} prompts)")
    return [value] * count


def bootstrap_of(host: Any, port: Any, room: Any) -> Bootstrap | list[Bootstrap] | None:
    """The disaggregation fields sglang-router adds to a request (all three or none); lists
    give one per prompt of a batch. Raises ValueError naming what to change."""
    values = [host, port, room]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        raise ValueError(
            "bootstrap_host, bootstrap_port and bootstrap_room come together (sglang-router "
            "--pd-disaggregation sends all three); give all or none"
        )
    count = max((len(v) for v in values if isinstance(v, list)), default=0)
    if not count:
        return _bootstrap(host, port, room)
    spread = [v if isinstance(v, list) else [v] * count for v in values]
    if any(len(v) != count for v in spread):
        raise ValueError("bootstrap_host, bootstrap_port and bootstrap_room lists must have one entry per prompt")
    return [_bootstrap(*one) for one in zip(*spread)]


def _bootstrap(host: Any, port: Any, room: Any) -> Bootstrap:
    if not isinstance(host, str) or not _is_host(host):
        raise ValueError(f"bootstrap_host must be an IP address or a host name, got {host!r:.80}")
    if type(port) is not int or not 0 < port < 65536:
        raise ValueError(f"bootstrap_port must be a TCP port (1-65535), got {port!r}")
    if type(room) is not int or not 0 <= room < 2**64:
        raise ValueError(f"bootstrap_room must be an integer in [0, 2**64), got {room!r}")
    return Bootstrap(host=host, port=port, room=room)


def _is_host(host: str) -> bool:
    """An IP address, or a DNS name (dot-separated labels of letters, digits and inner hyphens)."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.split(".")
    return len(host) <= 253 and all(
        0 < len(label) <= 63
        and label.isascii()
        and label.replace("-", "").isalnum()
        and not label.startswith("-")
        and not label.endswith("-")
        for label in labels
    )
