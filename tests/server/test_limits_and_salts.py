"""Cache namespaces (cache_salt) and the concurrent-request limit."""

from __future__ import annotations

import asyncio
import json
import time


def test_different_cache_salts_never_share_prefixes(server):
    body = {"input_ids": list(range(2000, 2100)), "sampling_params": {"max_new_tokens": 1}}
    first = server.request("POST", "/generate", {**body, "cache_salt": "tenant-a"})[1]
    same = server.request("POST", "/generate", {**body, "cache_salt": "tenant-a"})[1]
    other = server.request("POST", "/generate", {**body, "cache_salt": "tenant-b"})[1]
    unsalted = server.request("POST", "/generate", body)[1]
    assert first["meta_info"]["cached_tokens"] == 0 and same["meta_info"]["cached_tokens"] == 99
    assert other["meta_info"]["cached_tokens"] == 0 and unsalted["meta_info"]["cached_tokens"] == 0


async def _status_of_stream(server, body: dict) -> tuple[int, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    data = json.dumps(body).encode()
    writer.write(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    return status, writer


def test_requests_over_the_concurrency_limit_get_429(launch):
    server = launch("--max-concurrent-requests", "2")
    long = {"input_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True}}

    async def run() -> list[int]:
        a, wa = await _status_of_stream(server, long)
        b, wb = await _status_of_stream(server, long)
        await asyncio.sleep(0.5)
        c, wc = await _status_of_stream(server, long)
        for w in (wa, wb, wc):
            w.close()
        return [a, b, c]

    assert asyncio.run(run()) == [200, 200, 429]
    for _ in range(50):  # capacity comes back once the disconnected streams are aborted
        status, payload = server.request(
            "POST", "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}, key=None
        )
        if status != 429:
            break
        time.sleep(0.1)
    assert status == 200 and len(payload["output_ids"]) <= 2


def test_the_api_key_is_in_no_process_command_line(launch, tmp_path):
    from pathlib import Path

    secret = "sk-arbor-cmdline-probe-7731"
    key_file = tmp_path / "key"
    key_file.write_text(secret + "\n")
    server = launch("--api-key-file", str(key_file))
    pids = [server.proc.pid] + [
        int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == server.proc.pid
    ]
    assert len(pids) == 3  # the server, the scheduler and the detokenizer
    for pid in pids:
        assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert server.request("GET", "/get_model_info", key=secret)[0] == 200
    assert server.request("GET", "/get_model_info", key=secret + "x")[0] == 401


def _parent(proc_dir) -> int:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_tenants_have_their_own_caches_rids_and_aborts(launch, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("tenant-a-key\ntenant-b-key\n")
    admin = tmp_path / "admin"
    admin.write_text("admin-key\n")
    server = launch("--api-key-file", str(keys), "--admin-api-key-file", str(admin))
    a, b = "tenant-a-key", "tenant-b-key"
    prompt = {"input_ids": list(range(3000, 3100)), "sampling_params": {"max_new_tokens": 1}}
    server.request("POST", "/generate", prompt, key=a)
    assert server.request("POST", "/generate", prompt, key=a)[1]["meta_info"]["cached_tokens"] == 99
    assert server.request("POST", "/generate", prompt, key=b)[1]["meta_info"]["cached_tokens"] == 0

    async def scenario() -> tuple:
        loop = asyncio.get_running_loop()
        long = {"text": "x", "rid": "shared-rid", "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}
        running = loop.run_in_executor(None, lambda: server.request("POST", "/generate", long, key=a))
        await asyncio.sleep(0.5)
        other = server.request("POST", "/generate", {**long, "sampling_params": {"max_new_tokens": 2}}, key=b)
        stranger = server.request("POST", "/abort_request", {"rid": "shared-rid"}, key=b)
        return (await running)[1], other, stranger

    finished, other, stranger = asyncio.run(scenario())
    assert other[0] == 200  # the same rid under another tenant is another request
    assert stranger[1]["found"] is False and finished["meta_info"]["finish_reason"]["type"] == "length"
    assert server.request("POST", "/flush_cache", key=a)[0] == 403
    assert server.request("POST", "/flush_cache", key="admin-key")[0] == 200
    assert server.request("GET", "/get_model_info", key="nobody")[0] == 401
