"""The PD secret: shared by sglang-router and every prefill and decode worker. It authenticates
the router's requests that carry bootstrap fields and signs every bootstrap message, so a peer
without it can neither direct a worker's KV nor forge a transfer's outcome."""

from __future__ import annotations

import hashlib
import hmac
import os

from arbor.runtime.config import DisaggArgs

SECRET_ENV = "ARBOR_PD_SECRET"
MAC_BYTES = 32  # HMAC-SHA256
MAX_FRAME_BYTES = 1 << 20  # a KVPull with NIXL metadata is a few KB; anything this big is refused
_DOMAIN = b"arbor-pd-bootstrap/1\0"  # a MAC made here means nothing to another protocol


def load_secret(path: str | None) -> str | None:
    """The secret from `path`'s first line, else from ARBOR_PD_SECRET; None when neither has one."""
    if path:
        with open(path, encoding="utf-8") as f:
            first = next((line.strip() for line in f if line.strip()), "")
        if not first:
            raise ValueError(f"the PD secret file {path} is empty")
        return _checked(first)
    value = os.environ.get(SECRET_ENV, "").strip()
    return _checked(value) if value else None


def require_secret(disagg: DisaggArgs) -> str:
    """The PD secret a disaggregated worker must have; a clear error when it has none."""
    secret = load_secret(disagg.secret_file)
    if secret is None:
        raise ValueError(
            f"--disaggregation-mode {disagg.mode} needs the PD secret that sglang-router "
            f"(--api-key) and every worker share: --disaggregation-secret-file FILE or {SECRET_ENV} "
            "in the environment (see docs/security.md)"
        )
    return secret


def _checked(secret: str) -> str:
    if len(secret) < 16:
        raise ValueError("the PD secret must be at least 16 characters (e.g. `openssl rand -hex 32`)")
    return secret


class Sealer:
    """Signs bootstrap payloads as [mac, payload] and opens them, refusing any other shape."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(_DOMAIN + secret.encode()).digest()

    def seal(self, payload: bytes) -> list[bytes]:
        """The frames to send for `payload`."""
        return [self._mac(payload), payload]

    def open(self, frames: list[bytes]) -> bytes | None:
        """The payload of well-formed, authentic `frames`; None for anything else."""
        if len(frames) != 2:
            return None
        mac, payload = frames
        if len(mac) != MAC_BYTES or len(payload) > MAX_FRAME_BYTES:
            return None
        return payload if hmac.compare_digest(mac, self._mac(payload)) else None

    def seal_bytes(self, payload: bytes) -> bytes:
        """`payload` with its MAC in front: one buffer, for a transfer notification."""
        return self._mac(payload) + payload

    def open_bytes(self, data: bytes) -> bytes | None:
        """The payload of an authentic `seal_bytes` buffer, or None."""
        return self.open([data[:MAC_BYTES], data[MAC_BYTES:]])

    def _mac(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()
