"""Who may set a request's bootstrap fields (bootstrap_host, bootstrap_port, bootstrap_room).

They tell a disaggregated worker where its KV comes from: a decode worker connects to the
host they name and registers a buffer for it to write. Only the router may set them: a caller
that presented the PD secret, or one calling from an address in --disaggregation-allowed-peers.
A decode worker pulls only from its --disaggregation-prefill-peers.
"""

from __future__ import annotations

import ipaddress

from arbor.runtime.config import DisaggArgs
from arbor.runtime.io.messages import Bootstrap
from arbor.runtime.server.auth import Caller
from arbor.runtime.server.errors import ApiError


class BootstrapGate:
    """Checks a request's bootstrap fields against the caller and the configured peers."""

    def __init__(self, disagg: DisaggArgs) -> None:
        self.mode = disagg.mode
        self.clients = [
            ipaddress.ip_network(a.strip(), strict=False) for a in (disagg.allowed_peers or "").split(",") if a.strip()
        ]
        self.peers = _peers(disagg.prefill_peers or "")

    def check(self, boot: Bootstrap | list[Bootstrap] | None, caller: Caller, client: str | None) -> None:
        """Raise a 403 unless `caller` (from address `client`) may send `boot` here."""
        if boot is None or self.mode == "null":  # a worker that does both ignores the fields
            return
        if not (caller.pd or self._allowed(client)):
            raise ApiError(
                403,
                "bootstrap_host, bootstrap_port and bootstrap_room may be set only by the PD "
                "router: present the PD secret (Authorization: Bearer, sglang-router's --api-key) "
                "or call from an address in --disaggregation-allowed-peers",
                "permission_error",
                "bootstrap_host",
            )
        if self.mode != "decode":
            return
        for one in boot if isinstance(boot, list) else [boot]:
            if (one.host, one.port) not in self.peers:
                raise ApiError(
                    403,
                    f"{one.host}:{one.port} is not one of this decode worker's prefill peers "
                    "(--disaggregation-prefill-peers)",
                    "permission_error",
                    "bootstrap_host",
                )

    def _allowed(self, client: str | None) -> bool:
        if client is None or not self.clients:
            return False
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return False
        return any(address in net for net in self.clients)


def _peers(spec: str) -> set[tuple[str, int]]:
    """HOST:PORT entries of --disaggregation-prefill-peers."""
    peers = set()
    for entry in (e.strip() for e in spec.split(",") if e.strip()):
        host, _, port = entry.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--disaggregation-prefill-peers entry {entry!r} is not HOST:PORT")
        peers.add((host.strip("[]"), int(port)))
    return peers
