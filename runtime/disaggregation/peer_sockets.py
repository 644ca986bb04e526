"""A decode worker's sockets to prefill workers' bootstrap ports: one per peer, at most `limit`
open, the least recently used closed first (preferring a peer that owes no reply)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

import zmq

from arbor.runtime.disaggregation.secret import MAC_BYTES, MAX_FRAME_BYTES

Peer = tuple[str, int]


class PeerSockets:
    """DEALER sockets by (host, port), bounded in number."""

    def __init__(self, ctx: zmq.Context, limit: int) -> None:
        self.ctx = ctx
        self.limit = limit
        self._socks: OrderedDict[Peer, zmq.Socket] = OrderedDict()

    def get(self, peer: Peer, busy: Callable[[Peer], bool]) -> zmq.Socket:
        """The socket to `peer`, opened (closing another if `limit` are open) when there is none.
        `busy(peer)` says whether a peer still owes replies: such sockets are closed last."""
        sock = self._socks.get(peer)
        if sock is None:
            if len(self._socks) >= self.limit:
                idle = next((p for p in self._socks if not busy(p)), next(iter(self._socks)))
                self._socks.pop(idle).close()
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES + MAC_BYTES)  # a bigger frame drops the peer
            try:
                sock.connect(f"tcp://{peer[0]}:{peer[1]}")
            except zmq.ZMQError:
                sock.close()
                raise
            self._socks[peer] = sock
        self._socks.move_to_end(peer)
        return sock

    def items(self) -> Iterator[tuple[Peer, zmq.Socket]]:
        """(peer, socket) pairs, a snapshot: a caller may open or close sockets meanwhile."""
        return iter(list(self._socks.items()))

    def __len__(self) -> int:
        return len(self._socks)

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
