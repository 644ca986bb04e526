"""Tenants on one server: each key reads only its own counters; the whole server's statistics
(/metrics, /get_load, the scheduler's stats) need the admin key or --metrics-port on 127.0.0.1;
/health_generate needs a key and a concurrency slot; no filesystem path reaches a tenant; a
request body has a total deadline."""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import Server, _free_port, start_server, stop_server

A, B, ADMIN = "tenant-a-key", "tenant-b-key", "admin-key"


@pytest.fixture(scope="module")
def tenants(tiny_model, tmp_path_factory) -> Iterator[Server]:
    """Two tenant keys, an admin key, --metrics-port, one request at a time, short body limits."""
    folder = tmp_path_factory.mktemp("keys")
    (folder / "keys").write_text(f"{A}\n{B}\n")
    (folder / "admin").write_text(f"{ADMIN}\n")
    server = start_server(
        str(tiny_model("llama")),
        "--api-key-file",
        str(folder / "keys"),
        "--admin-api-key-file",
        str(folder / "admin"),
        "--metrics-port",
        str(_free_port()),
        "--max-concurrent-requests",
        "1",
        "--body-timeout-s",
        "2",
        "--body-deadline-s",
        "3",
    )
    yield server
    stop_server(server)


def _metrics_port(server: Server) -> int:
    cmd = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")
    return int(cmd[cmd.index(b"--metrics-port") + 1])


def _generate(server: Server, key: str, ids: list[int], tokens: int) -> dict:
    status, body = server.request(
        "POST",
        "/generate",
        {"input_ids": ids, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}},
        key=key,
    )
    assert status == 200, body
    return body


def test_a_tenant_reads_only_its_own_counters(tenants):
    _generate(tenants, A, list(range(100, 110)), 3)
    for _ in range(2):
        _generate(tenants, B, list(range(200, 205)), 2)
    status, info = tenants.request("GET", "/get_server_info", key=A)
    assert status == 200
    assert info["stats"] == {"num_requests": 1, "prompt_tokens": 10, "generation_tokens": 3, "cached_tokens": 0}
    assert "inflight" not in info and "tenants" not in info
    b = tenants.request("GET", "/get_server_info", key=B)[1]["stats"]
    assert b["num_requests"] == 2 and b["prompt_tokens"] == 10 and b["cached_tokens"] == 4
    admin = tenants.request("GET", "/get_server_info", key=ADMIN)[1]
    assert {"running", "waiting", "free_slots"} <= set(admin["stats"]) and "inflight" in admin
    assert sorted(t["num_requests"] for t in admin["tenants"].values()) == [1, 2]


def test_global_statistics_need_the_admin_key(tenants):
    for path in ("/metrics", "/get_load"):
        status, body = tenants.request("GET", path, key=A)
        assert status == 403 and "admin key" in body["error"]["message"], body
        assert tenants.request("GET", path, key=None)[0] == 401
    status, text = tenants.request("GET", "/metrics", key=ADMIN)
    assert status == 200 and "sglang:num_requests" in text
    status, load = tenants.request("GET", "/get_load", key=ADMIN)
    assert status == 200 and load[0]["dp_rank"] == 0


def test_the_metrics_port_serves_metrics_on_loopback_only(tenants):
    port = _metrics_port(tenants)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 200 and b"sglang:num_running_reqs" in resp.read()
    conn.close()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/v1/models")
    assert conn.getresponse().status == 404  # nothing but /metrics, and no key on this port
    assert _listening_addresses(port) == {"127.0.0.1"}


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on `port` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add(socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, packed))
    return found


def test_health_generate_needs_a_key_and_a_concurrency_slot(tenants):
    assert tenants.request("GET", "/health_generate", key=None)[0] == 401
    assert tenants.request("GET", "/health_generate", key=A) == (200, {"status": "ok"})
    conn = http.client.HTTPConnection(tenants.host, tenants.port, timeout=60)
    conn.request(
        "POST",
        "/generate",
        body=b'{"input_ids": [1, 2], "stream": true, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": true}}',
        headers={"Authorization": f"Bearer {B}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200
    resp.readline()  # the stream is running: it holds the one slot
    try:
        assert tenants.request("GET", "/health_generate", key=A)[0] == 429
    finally:
        conn.close()
    _eventually(lambda: tenants.request("GET", "/health_generate", key=A)[0] == 200)


def _eventually(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "never became true"
        time.sleep(0.1)


def test_no_filesystem_path_reaches_a_tenant(tenants):
    info = tenants.request("GET", "/get_model_info", key=A)[1]
    assert info["model_path"] == info["tokenizer_path"] == info["served_model_name"] == tenants.model
    models = tenants.request("GET", "/v1/models", key=A)[1]
    assert models["data"][0]["root"] == tenants.model
    server_info = tenants.request("GET", "/get_server_info", key=A)[1]
    assert "/" not in server_info["model_path"] + server_info["tokenizer_path"]
    assert tenants.request("GET", "/get_model_info", key=ADMIN)[1]["model_path"].endswith("/" + tenants.model)


def test_a_trickled_body_is_cut_off_at_the_total_deadline(tenants):
    """One byte every 0.5 s never stalls past --body-timeout-s (2 s), but the whole body
    passes --body-deadline-s (3 s): 408, and the connection is closed."""
    body = b'{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}' + b" " * 100
    head = (
        f"POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {A}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((tenants.host, tenants.port), timeout=10) as sock:
        sock.sendall(head)
        start = time.monotonic()
        for byte in body:  # bounded: at most len(body) sends, 0.5 s apart
            # Look for the answer before each byte: a byte sent after the server closed would
            # draw a reset, which can take the unread answer with it (the test was flaky so).
            if select.select([sock], [], [], 0.5)[0]:
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # the server closed the connection
        elapsed = time.monotonic() - start
        sock.settimeout(5)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):  # then the server closes it
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"--body-deadline-s" in answer and 2.5 < elapsed < 6, (answer, elapsed)


def test_error_messages_name_no_source_file_or_directory(tenants):
    status, body = tenants.request(
        "POST",
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": 2, "ebnf": 'root ::= "a" | undefined_rule'}},
        key=A,
    )
    message = body["error"]["message"]
    assert status == 400 and "undefined_rule" in message, body
    assert "/" not in message and ".cc" not in message, message  # xgrammar names its C++ source file
