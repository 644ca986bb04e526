"""A decode worker's sockets to prefill peers stay bounded: the least recently used one closes
first, a peer that still owes replies last; real ZMQ sockets."""

from __future__ import annotations

import zmq

from arbor.runtime.disaggregation.peer_sockets import PeerSockets


def test_sockets_are_bounded_and_the_least_recently_used_idle_one_closes():
    ctx = zmq.Context()
    socks = PeerSockets(ctx, limit=3)
    try:
        opened = {port: socks.get(("127.0.0.1", port), lambda peer: False) for port in (1001, 1002, 1003)}
        socks.get(("127.0.0.1", 1001), lambda peer: False)  # used again: 1002 is now the oldest
        socks.get(("127.0.0.1", 1004), lambda peer: False)
        assert len(socks) == 3 and opened[1002].closed and not opened[1001].closed
        busy = {("127.0.0.1", 1003)}  # the oldest now, but it owes a reply: 1001 goes instead
        socks.get(("127.0.0.1", 1005), busy.__contains__)
        assert opened[1001].closed and not opened[1003].closed
        for port in range(2000, 2200):  # many distinct peers: never more than the limit open
            socks.get(("127.0.0.1", port), lambda peer: False)
        assert len(socks) == 3
    finally:
        socks.close()
        ctx.term()
