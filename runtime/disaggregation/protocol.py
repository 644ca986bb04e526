"""Messages between a decode worker and a prefill worker's bootstrap socket (msgpack, never pickle).

The decode worker sends `KVPull` (a staging buffer registered for this room alone, a nonce)
and may send `KVCancel`; the prefill worker answers `KVFailed` or `KVCancelled` on the same
socket, and announces a finished transfer with `KVDone` as the transfer's NIXL notification,
so it arrives after the data. Every message is signed with the PD secret (`secret.Sealer`);
`BootstrapCodec` turns frames into messages and refuses, without raising, anything that is
unsigned, malformed or out of range.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import msgspec

from arbor.runtime.disaggregation.secret import Sealer
from arbor.runtime.scheduler.stats import SchedulerStats

logger = logging.getLogger(__name__)
Room = Annotated[int, msgspec.Meta(ge=0)]  # msgpack ints stop at 2**64
Count = Annotated[int, msgspec.Meta(ge=0, lt=2**31)]
Address = Annotated[int, msgspec.Meta(ge=0)]
Nonce = Annotated[bytes, msgspec.Meta(min_length=16, max_length=16)]
MAX_LAYERS = 1024
MAX_TEXT = 4096


class PoolLayout(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a peer writes one room's KV: a staging buffer registered with a transfer agent for
    this room alone (K then V of each layer, `slots` token rows each)."""

    agent: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    metadata: Annotated[bytes, msgspec.Meta(max_length=1 << 19)]  # the agent's connection info, this buffer only
    k_ptrs: Annotated[list[Address], msgspec.Meta(max_length=MAX_LAYERS)]
    v_ptrs: Annotated[list[Address], msgspec.Meta(max_length=MAX_LAYERS)]
    slot_bytes: Annotated[int, msgspec.Meta(gt=0, lt=2**24)]  # bytes of one token's K (and of its V) in one layer
    slots: Count  # token rows behind each pointer
    mem_type: Annotated[str, msgspec.Meta(pattern="^(DRAM|VRAM)$")]
    device_id: Annotated[int, msgspec.Meta(ge=0, lt=1024)] = 0


class _Msg(msgspec.Struct, tag=True, kw_only=True, forbid_unknown_fields=True):
    room: Room


class KVPull(_Msg):
    """Decode -> prefill: write the KV of positions [skip, kv_len) of room's prompt into
    `layout`'s rows 0 .. kv_len - skip - 1, then notify with `nonce`."""

    layout: PoolLayout
    skip: Count  # positions the decode worker already holds (its own radix cache hit)
    kv_len: Count  # prompt positions (plus tokens a grammar forced before sampling)
    tokens_crc: Annotated[int, msgspec.Meta(ge=0, lt=2**32)]  # crc32 of those positions' token ids
    nonce: Nonce  # echoed in KVDone: only the peer that got this pull can finish the room


class KVCancel(_Msg):
    """Decode -> prefill: the request ended; do not start its transfer."""


class KVFailed(_Msg):
    """Prefill -> decode: no KV will come for this room, and why."""

    message: Annotated[str, msgspec.Meta(max_length=MAX_TEXT)]


class KVCancelled(_Msg):
    """Prefill -> decode: the cancel arrived before the transfer started; nothing will be written."""


class KVDone(_Msg):
    """Prefill -> decode (only as the transfer's notification): the KV is written; `token` is the
    first token the prefill worker sampled after it, with its logprobs when the request asked
    for them. (Prompt logprobs stay with the prefill worker's answer; the router merges them.)"""

    nonce: Nonce
    agent: Annotated[str, msgspec.Meta(max_length=256)]  # the sender: must be who NIXL says sent it
    kv_len: Count
    token: Count
    logprob: float | None = None
    top_logprobs: Annotated[list[tuple[float, Count]], msgspec.Meta(max_length=1024)] = []


ToPrefill = KVPull | KVCancel
ToDecode = KVFailed | KVCancelled


def pull_problem(pull: KVPull) -> str | None:
    """What is inconsistent inside a well-typed pull, or None."""
    layout = pull.layout
    if len(layout.k_ptrs) != len(layout.v_ptrs) or not layout.k_ptrs:
        return f"the pull for room {pull.room} names {len(layout.k_ptrs)} K and {len(layout.v_ptrs)} V layers"
    if pull.skip > pull.kv_len or layout.slots != pull.kv_len - pull.skip:
        return (
            f"the pull for room {pull.room} asks for positions [{pull.skip}, {pull.kv_len}) into "
            f"{layout.slots} staging rows"
        )
    return None


class BootstrapCodec:
    """Signed msgpack frames <-> messages; a decode never raises and returns None for any
    frame list that is unsigned, malformed, mistyped or inconsistent."""

    def __init__(self, secret: str) -> None:
        self.sealer = Sealer(secret)
        self._encoder = msgspec.msgpack.Encoder()
        self._to_prefill = msgspec.msgpack.Decoder(ToPrefill)
        self._to_decode = msgspec.msgpack.Decoder(ToDecode)
        self._done = msgspec.msgpack.Decoder(KVDone)

    def encode(self, msg: _Msg) -> list[bytes]:
        """`msg` as the signed frames of one ZMQ message."""
        return self.sealer.seal(self._encoder.encode(msg))

    def encode_done(self, msg: KVDone) -> bytes:
        """A KVDone as one signed buffer, the transfer's notification."""
        return self.sealer.seal_bytes(self._encoder.encode(msg))

    def to_prefill(self, frames: list[bytes]) -> KVPull | KVCancel | None:
        """A message for a prefill worker's bootstrap socket, or None."""
        msg = self._decode(self._to_prefill, self.sealer.open(frames))
        if isinstance(msg, KVPull) and pull_problem(msg) is not None:
            return None
        return msg

    def to_decode(self, frames: list[bytes]) -> KVFailed | KVCancelled | None:
        """A prefill worker's reply on a decode worker's socket, or None."""
        return self._decode(self._to_decode, self.sealer.open(frames))

    def done(self, data: bytes) -> KVDone | None:
        """A transfer's notification, or None."""
        return self._decode(self._done, self.sealer.open_bytes(data))

    @staticmethod
    def _decode(decoder: msgspec.msgpack.Decoder, payload: bytes | None) -> Any:
        if payload is None:
            return None
        try:
            return decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None


def reject(stats: SchedulerStats, what: str) -> None:
    """Count a dropped message (`bootstrap_rejected`); warn on the first only, so a flood of
    them cannot flood the log."""
    if not stats.bootstrap_rejected:
        logger.warning("dropped %s (counted in arbor_bootstrap_rejected; further ones are not logged)", what)
    stats.bootstrap_rejected += 1
