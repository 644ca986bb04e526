"""The bootstrap protocol's decoder (PD disaggregation): signed, well-formed messages round-trip;
anything else, random bytes, unsigned or re-signed garbage, wrong shapes and out-of-range
fields included, is refused with None and never raises."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbor.runtime.disaggregation.protocol import (
    BootstrapCodec,
    KVCancel,
    KVDone,
    KVFailed,
    KVPull,
    PoolLayout,
)
from arbor.runtime.disaggregation.secret import MAX_FRAME_BYTES, Sealer, load_secret

SECRET = "codec-test-secret-0123456789"
CODEC = BootstrapCodec(SECRET)


def _pull(**overrides: object) -> KVPull:
    layout = PoolLayout(
        agent="arbor-decode-1",
        metadata=b"md",
        k_ptrs=[4096, 8192],
        v_ptrs=[12288, 16384],
        slot_bytes=256,
        slots=6,
        mem_type="DRAM",
    )
    fields = {"room": 7, "layout": layout, "skip": 2, "kv_len": 8, "tokens_crc": 1234, "nonce": b"n" * 16}
    return KVPull(**{**fields, **overrides})  # type: ignore[arg-type]


def test_signed_messages_round_trip():
    pull = _pull()
    assert CODEC.to_prefill(CODEC.encode(pull)) == pull
    assert CODEC.to_prefill(CODEC.encode(KVCancel(room=3))) == KVCancel(room=3)
    assert CODEC.to_decode(CODEC.encode(KVFailed(room=3, message="x"))) == KVFailed(room=3, message="x")
    done = KVDone(room=7, nonce=b"n" * 16, agent="arbor-prefill-1", kv_len=8, token=5)
    assert CODEC.done(CODEC.encode_done(done)) == done


def test_a_message_signed_with_another_secret_is_refused():
    other = BootstrapCodec("another-secret-0123456789")
    assert CODEC.to_prefill(other.encode(_pull())) is None
    assert CODEC.done(other.encode_done(KVDone(room=1, nonce=b"n" * 16, agent="a", kv_len=1, token=1))) is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"skip": 9},  # skips past the prompt
        {"kv_len": 20},  # more positions than the staging buffer holds
        {"nonce": b"short"},
        {"room": -1},
        {"tokens_crc": 2**40},
    ],
)
def test_signed_but_inconsistent_pulls_are_refused(overrides):
    raw = msgspec.msgpack.encode(msgspec.structs.replace(_pull(), **overrides))
    assert CODEC.to_prefill(Sealer(SECRET).seal(raw)) is None


def test_frame_shapes_are_refused():
    mac, payload = CODEC.encode(KVCancel(room=1))
    assert CODEC.to_prefill([payload]) is None
    assert CODEC.to_prefill([mac, payload, b""]) is None
    assert CODEC.to_prefill([mac[:-1], payload]) is None
    assert CODEC.to_prefill([mac, payload[:-1]]) is None
    assert CODEC.to_prefill(Sealer(SECRET).seal(b"\x00" * (MAX_FRAME_BYTES + 1))) is None


def test_the_secret_must_be_long(tmp_path, monkeypatch):
    path = tmp_path / "secret"
    path.write_text("short\n")
    with pytest.raises(ValueError, match="at least 16"):
        load_secret(str(path))
    monkeypatch.setenv("ARBOR_PD_SECRET", "x" * 20)
    assert load_secret(None) == "x" * 20


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)
_tagged = st.builds(
    lambda tag, rest: {"type": tag, **rest},
    st.sampled_from(["KVPull", "KVCancel", "KVFailed", "KVCancelled", "KVDone", "x"]),
    st.dictionaries(
        st.sampled_from(
            [
                "room",
                "layout",
                "skip",
                "kv_len",
                "tokens_crc",
                "nonce",
                "message",
                "agent",
                "token",
                "top_logprobs",
                "k_ptrs",
            ]
        ),
        _json,
        max_size=8,
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_frames_never_raise(frames):
    assert CODEC.to_prefill(frames) is None
    assert CODEC.to_decode(frames) is None
    assert CODEC.done(b"".join(frames)) is None


@settings(max_examples=400, deadline=None)
@given(st.one_of(_tagged, _json))
def test_signed_random_structures_never_raise(value):
    frames = Sealer(SECRET).seal(msgspec.msgpack.encode(value))
    for decoded in (CODEC.to_prefill(frames), CODEC.to_decode(frames), CODEC.done(b"".join(frames))):
        assert decoded is None or isinstance(decoded, msgspec.Struct)
