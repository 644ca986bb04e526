"""build_batch: reserve a step's KV and assemble its ForwardBatch (the target's steps and the draft's)."""

from __future__ import annotations

from collections.abc import Sequence

from arbor.runtime.kv.manager import KVManager
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.scheduler.req import Req


def build_batch(
    kv: KVManager,
    mode: ForwardMode,
    reqs: Sequence[Req],
    ends: Sequence[int],
    inputs: Sequence[Sequence[int]],
    all_logits: bool = False,
) -> ForwardBatch | None:
    """Reserve slots for positions [kv_len, ends[i]) of each request and build the batch that
    writes `inputs[i]` there; None (nothing reserved) when the KV cannot be freed."""
    loc = kv.reserve(reqs, ends)
    if loc is None:
        return None
    return ForwardBatch.build(
        mode,
        inputs,
        [r.kv_len for r in reqs],
        [r.row for r in reqs],
        loc,
        kv.req_to_token.table,
        return_all_logits=all_logits,
    )
