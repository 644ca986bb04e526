"""Connection limits: idle, half-sent-header and slow-body connections do not stay open, and
connections beyond --max-connections get 503 while the ones within it are served."""

from __future__ import annotations

import socket
import time

import pytest


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes `sock` within `seconds` (reads until EOF or the deadline)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.fixture
def guarded(launch):
    return launch("--header-timeout-s", "1", "--body-timeout-s", "1", "--max-connections", "6")


def test_idle_and_half_sent_header_connections_are_closed(guarded):
    idle = socket.create_connection((guarded.host, guarded.port))
    trickle = socket.create_connection((guarded.host, guarded.port))
    trickle.sendall(b"POST /generate HTTP/1.1\r\n")
    started = time.monotonic()
    for piece in (b"Host: x\r\n", b"Content-Type: application/json\r\n", b"X-Slow: 1\r\n"):
        time.sleep(0.3)
        trickle.sendall(piece)
    assert _closed_within(trickle, 3) and time.monotonic() - started < 3
    assert _closed_within(idle, 3)
    assert guarded.request("GET", "/health", key=None)[0] == 200


def test_a_stalled_body_gets_408(guarded):
    sock = socket.create_connection((guarded.host, guarded.port))
    sock.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer test-key\r\n"
        b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"text": '
    )
    sock.settimeout(5)
    reply = b""
    while b"}}" not in reply:
        reply += sock.recv(4096)
    text = reply.decode()
    assert text.startswith("HTTP/1.1 408") and "body-timeout-s" in text, text


def test_connections_beyond_the_limit_get_503_and_the_rest_are_served(guarded):
    held = [socket.create_connection((guarded.host, guarded.port)) for _ in range(6)]
    try:
        assert guarded.request("GET", "/health", key=None)[0] == 503
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    status, out = guarded.request("POST", "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 2}})
    assert status == 200, out
