"""Messages between a decode worker and a prefill worker's bootstrap socket (msgpack, never pickle).

The decode worker sends `KVPull` (where its pool is, which slots to fill) and may send
`KVCancel`; the prefill worker answers `KVFailed` or `KVCancelled` on the same socket, and
announces a finished transfer with `KVDone` as the transfer's NIXL notification, so it
arrives after the data.
"""

from __future__ import annotations

import msgspec


class PoolLayout(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's KV pool as a peer writes into it: its transfer agent and each layer's K/V base address."""

    agent: str
    metadata: bytes  # the transfer agent's connection info
    k_ptrs: list[int]
    v_ptrs: list[int]
    slot_bytes: int  # bytes of one token's K (and of its V) in one layer
    mem_type: str  # "DRAM" or "VRAM"
    device_id: int = 0


class _Msg(msgspec.Struct, tag=True, kw_only=True):
    room: int


class KVPull(_Msg):
    """Decode -> prefill: write the KV of positions [skip, kv_len) of room's prompt into `dst_slots`."""

    layout: PoolLayout
    skip: int  # positions the decode worker already holds (its own radix cache hit)
    kv_len: int  # prompt positions (plus tokens a grammar forced before sampling)
    tokens_crc: int  # crc32 of those positions' token ids: both workers must hold the same prompt
    dst_slots: bytes  # int32 slot per position in [skip, kv_len)


class KVCancel(_Msg):
    """Decode -> prefill: the request ended; do not start its transfer."""


class KVFailed(_Msg):
    """Prefill -> decode: no KV will come for this room, and why."""

    message: str


class KVCancelled(_Msg):
    """Prefill -> decode: the cancel arrived before the transfer started; nothing will be written."""


class KVDone(_Msg):
    """Prefill -> decode (as the transfer's notification): the KV is written; `token` is the first
    token the prefill worker sampled after it, with its logprobs when the request asked for
    them. (Prompt logprobs stay with the prefill worker's answer; the router merges them.)"""

    kv_len: int
    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[float, int]] = []


ToPrefill = KVPull | KVCancel
ToDecode = KVFailed | KVCancelled | KVDone
