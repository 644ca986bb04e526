"""Prefill/decode disaggregation behind the unmodified sglang-router (`--pd-disaggregation`):
one prefill and one decode worker, the KV moved by NIXL (UCX, host memory). Outputs equal a
single worker's; the decode worker caches what it received; a failed, aborted or orphaned
transfer ends its request with a clear error and leaks no slot on either side."""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import signal
import time
from collections.abc import Iterator

import openai
import pytest
import torch

from tests.ecosystem.conftest import KEY, start_router, stop_router
from tests.server.conftest import Server, _free_port, start_server, stop_process, stop_server

pytest.importorskip("nixl")
TIMEOUT_S = 4  # --disaggregation-timeout-s of the workers here
SECRET = "pd-secret-for-tests-0123456789"  # shared by the router and both workers (ARBOR_PD_SECRET)
TENANT = "a-tenant-key"  # a client of the workers themselves, who must not steer their KV
ADMIN = "the-admin-key"  # reads the workers' statistics and flushes their caches


def _pair(
    model: str, *prefill_extra: str, port: int | None = None, peers: tuple[int, ...] = ()
) -> tuple[Server, Server, int]:
    """A prefill and a decode worker sharing SECRET; the decode worker pulls only from the
    prefill worker's bootstrap port and `peers` (ports on 127.0.0.1)."""
    port = port or _free_port()
    common = ("--enable-cache-report", "--disaggregation-timeout-s", str(TIMEOUT_S))
    env = {"ARBOR_PD_SECRET": SECRET, "ARBOR_API_KEY": TENANT, "ARBOR_ADMIN_API_KEY": ADMIN}
    prefill = start_server(
        model,
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        str(port),
        "--metrics-port",
        str(_free_port()),
        *common,
        *prefill_extra,
        env=env,
    )
    allowed = ",".join(f"127.0.0.1:{p}" for p in (port, *peers))
    try:
        decode = start_server(
            model,
            "--disaggregation-mode",
            "decode",
            "--disaggregation-prefill-peers",
            allowed,
            "--metrics-port",
            str(_free_port()),
            *common,
            env=env,
        )
    except BaseException:
        stop_server(prefill)
        raise
    return prefill, decode, port


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    """(the prefill worker's bootstrap port, a port where a fake prefill peer may listen)."""
    return _free_port(), _free_port()


@pytest.fixture(scope="module")
def pd(tiny_model, ports) -> Iterator[tuple[Server, Server, Server]]:
    """(router, prefill, decode); the prefill worker chunks prompts at 16 tokens. The decode
    worker accepts the prefill worker and the fake peer's port as prefill peers."""
    prefill, decode, port = _pair(
        str(tiny_model("llama")), "--chunked-prefill-size", "16", port=ports[0], peers=(ports[1],)
    )
    try:
        router = start_router([prefill], pd=(prefill, port, decode), api_key=SECRET)
    except BaseException:
        stop_server(prefill)
        stop_server(decode)
        raise
    yield router.front, prefill, decode
    stop_router(router)
    stop_server(prefill)
    stop_server(decode)


def _generate(server: Server, body: dict, key: str | None = SECRET) -> tuple[int, dict]:
    return server.request("POST", "/generate", body, key=key)


def _stats(server: Server) -> dict:
    status, info = server.request("GET", "/get_server_info", key=ADMIN)
    assert status == 200, info
    return info["stats"]


def _no_leak(server: Server, within_s: float) -> None:
    """Within `within_s`, every slot is free again once the radix cache is flushed."""
    deadline = time.monotonic() + within_s
    while True:
        server.request("POST", "/flush_cache", key=ADMIN)
        stats = _stats(server)
        if stats["free_slots"] == stats["total_slots"] and stats["invariant_ok"] == 1.0:
            return
        assert time.monotonic() < deadline, f"slots still held: {stats}"
        time.sleep(0.5)


PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog " * 6, "1 2 3 4 5 6 7 8", "import os\nimport sys\n"]


def test_mixed_batch_equals_a_single_worker(pd, sglang_server):
    front, prefill, decode = pd
    bodies = [{"text": p, "sampling_params": {"max_new_tokens": 12, "temperature": 0}} for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        got = list(pool.map(lambda b: _generate(front, b), bodies))
    for body, (status, out) in zip(bodies, got):
        assert status == 200, out
        want_status, want = _generate(sglang_server, body, KEY)
        assert want_status == 200
        assert out["output_ids"] == want["output_ids"], body["text"]
        assert out["text"] == want["text"]
    for worker in (prefill, decode):
        stats = _stats(worker)
        assert stats["kv_transfers"] >= len(bodies) and stats["kv_transfer_bytes"] > 0, stats


def test_second_turn_hits_the_decode_workers_cache(pd, sglang_server):
    front, _, _ = pd
    client = openai.OpenAI(base_url=front.base_url + "/v1", api_key=SECRET, max_retries=0)
    single = openai.OpenAI(base_url=sglang_server.base_url + "/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": "Tell me about disaggregated serving."}]
    replies = []
    for _ in range(2):
        reply = client.chat.completions.create(model=front.model, messages=messages, max_tokens=10, temperature=0)
        want = single.chat.completions.create(model=front.model, messages=messages, max_tokens=10, temperature=0)
        assert reply.choices[0].message.content == want.choices[0].message.content
        replies.append(reply)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "And then?"},
        ]
    first, second = (r.usage.prompt_tokens_details.cached_tokens for r in replies)
    # The second turn's prompt starts with the first turn's whole prompt (and reply), which
    # the decode worker received and cached: at least the first prompt, page-aligned, hits.
    assert second >= replies[0].usage.prompt_tokens - 1 > first


def test_streaming_through_the_router(pd, sglang_server):
    front, _, _ = pd
    body = {"text": "Streaming test:", "sampling_params": {"max_new_tokens": 10, "temperature": 0}, "stream": True}
    conn = http.client.HTTPConnection(front.host, front.port, timeout=60)
    conn.request("POST", "/generate", body=json.dumps(body), headers=_headers(SECRET))
    resp = conn.getresponse()
    assert resp.status == 200
    events = [
        json.loads(line[5:])
        for line in resp.read().decode().splitlines()
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]
    conn.close()
    assert len(events) > 1
    _, want = _generate(sglang_server, {**body, "stream": False}, KEY)
    assert events[-1]["text"] == want["text"]


def test_n_samples_and_grammar(pd, sglang_server):
    front, _, _ = pd
    client = openai.OpenAI(base_url=front.base_url + "/v1", api_key=SECRET, max_retries=0)
    out = client.completions.create(model=front.model, prompt="Count:", max_tokens=6, temperature=0, n=2)
    single = openai.OpenAI(base_url=sglang_server.base_url + "/v1", api_key=KEY, max_retries=0)
    want = single.completions.create(model=front.model, prompt="Count:", max_tokens=6, temperature=0, n=2)
    assert [c.text for c in out.choices] == [c.text for c in want.choices]
    body = {"text": "Code:", "sampling_params": {"max_new_tokens": 16, "temperature": 0, "regex": r"[0-9]{3}-[a-z]{2}"}}
    status, got = _generate(front, body)
    assert status == 200, got
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", got["text"])
    assert got["text"] == _generate(sglang_server, body, KEY)[1]["text"]


def test_logprobs_travel_with_the_first_token(pd, sglang_server):
    """The first token is sampled on the prefill worker: its logprob comes with the KV; the
    router merges the prefill worker's prompt logprobs. PD answers what one worker does."""
    front = pd[0]
    body = {
        "text": PROMPTS[2],
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0},
    }
    status, got = _generate(front, body)
    assert status == 200, got
    want = _generate(sglang_server, body, KEY)[1]
    for key in ("output_token_logprobs", "input_token_logprobs", "output_top_logprobs"):
        a, b = got["meta_info"][key], want["meta_info"][key]
        assert len(a) == len(b) > 0, key
        assert _close(a, b), (key, a, b)


def _close(a: object, b: object) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return b is not None and a is not None and abs(a - b) < 1e-4
    return a == b


def test_both_workers_report_transfers_in_metrics(pd):
    _, prefill, decode = pd
    for worker in (prefill, decode):
        status, text = worker.request("GET", "/metrics", key=ADMIN)
        assert status == 200
        moved = re.search(r"^arbor_kv_transfer_bytes (\S+)$", text, re.M)
        took = re.search(r"^arbor_kv_transfer_seconds (\S+)$", text, re.M)
        assert moved and float(moved.group(1)) > 0 and took and float(took.group(1)) > 0, text


def test_traffic_leaves_no_slot_held(pd):
    _, prefill, decode = pd
    _no_leak(prefill, 10)
    _no_leak(decode, 10)


def test_decode_worker_needs_bootstrap_info(pd):
    _, _, decode = pd
    status, body = _generate(decode, {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert status == 400 and "bootstrap" in body["error"]["message"], body


# --------------------------------------------------------------------------- adversaries


def _metric(server: Server, name: str) -> float:
    status, text = server.request("GET", "/metrics", key=ADMIN)
    assert status == 200, text
    found = re.search(rf"^arbor_{name} (\S+)$", text, re.M)
    assert found, text
    return float(found.group(1))


def test_clients_cannot_set_bootstrap_fields(pd, ports):
    """Only the router (the PD secret) may say where a worker's KV comes from, and a decode
    worker pulls only from its configured prefill peers."""
    _, prefill, decode = pd
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, **_boot(ports[0], 901)}
    for worker in (prefill, decode):
        status, out = _generate(worker, body, TENANT)
        assert status == 403 and "PD router" in out["error"]["message"], out
    completion = {"model": decode.model, "prompt": "Hi", "max_tokens": 2, **_boot(ports[0], 902)}
    status, out = decode.request("POST", "/v1/completions", completion, key=TENANT)
    assert status == 403 and out["error"]["param"] == "bootstrap_host", out
    status, out = _generate(decode, {**body, **_boot(1, 903)})  # the router's secret, an unknown peer
    assert status == 403 and "prefill peers" in out["error"]["message"], out
    status, out = _generate(decode, {**body, "bootstrap_host": "a b"})  # not a host ZMQ could even dial
    assert status == 400 and "bootstrap_host" in out["error"]["message"], out
    status, out = decode.request("POST", "/flush_cache", key=SECRET)  # the router's key is not the admin's
    assert status == 403, out
    _no_leak(decode, 5)


def test_bad_frames_on_the_bootstrap_port_are_dropped(pd, ports):
    """Malformed, truncated, oversized, unauthenticated and inconsistent frames: each dropped
    and counted; the prefill worker keeps serving."""
    import socket

    import msgspec
    import zmq

    from arbor.runtime.disaggregation.protocol import BootstrapCodec, KVCancel, KVPull, PoolLayout

    _, prefill, _ = pd
    before = _metric(prefill, "bootstrap_rejected")
    codec, forged = BootstrapCodec(SECRET), BootstrapCodec("not-the-secret-0123456789")
    layout = PoolLayout(agent="x", metadata=b"", k_ptrs=[1], v_ptrs=[1], slot_bytes=64, slots=4, mem_type="DRAM")
    pull = KVPull(room=77, layout=layout, skip=0, kv_len=4, tokens_crc=0, nonce=b"n" * 16)
    mac, payload = codec.encode(pull)
    bad = [
        [b"garbage"],  # one frame
        [b"\x00" * 32, msgspec.msgpack.encode(pull)],  # unsigned
        [mac, payload[:-3]],  # truncated
        [mac, payload, b"extra"],  # a frame too many
        forged.encode(KVCancel(room=77)),  # signed with another secret
        codec.sealer.seal(msgspec.msgpack.encode(msgspec.structs.replace(pull, skip=9))),  # signed, inconsistent
        codec.sealer.seal(msgspec.msgpack.encode({"type": "KVPull", "room": "x"})),  # signed, mistyped
    ]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)  # closing waits (5 s at most) until everything is sent
    sock.connect(f"tcp://127.0.0.1:{ports[0]}")
    for frames in bad:
        sock.send_multipart(frames)
    sock.send_multipart([b"\x00" * 32, b"\x00" * (2 << 20)])  # oversized: the peer is dropped
    sock.close()
    ctx.term()
    with socket.create_connection(("127.0.0.1", ports[0]), timeout=5) as raw:  # not even ZMTP
        raw.sendall(b"\xff" * 4096 + bytes(range(256)) * 16)
    deadline = time.monotonic() + 10
    while _metric(prefill, "bootstrap_rejected") < before + len(bad):
        assert time.monotonic() < deadline, "the prefill worker did not count the bad frames"
        time.sleep(0.2)
    assert prefill.request("GET", "/health", key=None)[0] == 200


def test_a_fake_prefill_peer_can_neither_finish_a_room_nor_reach_beyond_it(pd, ports, monkeypatch):
    """A peer without the secret gets a pull: its forged replies and notifications are dropped,
    its NIXL agent refuses it any address outside the room's staging buffer (the metadata names
    that buffer alone), and the request ends at the timeout without decoding unwritten KV."""
    import msgspec
    import zmq
    from nixl._api import nixl_agent, nixl_agent_config

    from arbor.runtime.disaggregation.protocol import BootstrapCodec, KVDone, KVFailed, KVPull

    _, _, decode = pd
    before = _metric(decode, "bootstrap_rejected")
    ctx = zmq.Context()
    try:
        fake = ctx.socket(zmq.ROUTER)
        fake.setsockopt(zmq.LINGER, 0)
        fake.bind(f"tcp://127.0.0.1:{ports[1]}")
        body = {"text": "word " * 40, "sampling_params": {"max_new_tokens": 4}, **_boot(ports[1], 904)}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_generate, decode, body)
            assert fake.poll(20_000), "the decode worker never asked the fake peer"
            peer, _, payload = fake.recv_multipart()
            pull = msgspec.msgpack.decode(payload, type=KVPull)  # read without the secret
            status, out = _generate(decode, body)  # the same room again, while the first waits
            assert status == 409 and "already in flight" in out["error"]["message"], out
            forged = BootstrapCodec("not-the-secret-0123456789")
            done = KVDone(room=pull.room, nonce=pull.nonce, agent="fake", kv_len=pull.kv_len, token=1)
            fake.send_multipart([peer, *forged.encode(KVFailed(room=pull.room, message="forged"))])
            fake.send_multipart([peer, b"\x00" * 32, msgspec.msgpack.encode(done)])
            monkeypatch.setenv("UCX_NET_DEVICES", "lo")
            agent = nixl_agent("fake", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
            agent.add_remote_agent(pull.layout.metadata)
            agent.send_notif(pull.layout.agent, forged.encode_done(done))
            agent.send_notif(pull.layout.agent, b"\x00" * 32 + msgspec.msgpack.encode(done))
            local = torch.zeros(1 << 16, dtype=torch.uint8)
            agent.register_memory([local])
            size = pull.layout.slot_bytes * pull.layout.slots
            outside = [pull.layout.k_ptrs[0] - 4096, pull.layout.v_ptrs[-1] + size, pull.layout.v_ptrs[-1] + size // 2]
            for address in outside:  # before, after, and straddling the end of the room's rows
                with pytest.raises(Exception, match="NOT_FOUND"):
                    agent.initialize_xfer(
                        "READ",
                        agent.get_xfer_descs([(local.data_ptr(), size, 0)], "DRAM"),
                        agent.get_xfer_descs([(address, size, 0)], "DRAM"),
                        pull.layout.agent,
                    )
            deadline = time.monotonic() + TIMEOUT_S
            while _metric(decode, "bootstrap_rejected") < before + 4:  # 2 replies, 2 notifications
                assert time.monotonic() < deadline, "the decode worker did not count the forgeries"
                agent.get_new_notifs()  # progresses the fake agent's sends (it has no progress thread)
                time.sleep(0.05)
            status, out = waiting.result(timeout=6 * TIMEOUT_S)
    finally:  # an open socket would keep the context, and pytest, from exiting
        ctx.destroy(linger=0)
    assert status == 504 and "did not arrive" in out["error"]["message"], out
    _no_leak(decode, 2 * TIMEOUT_S)


def _listening(pid: int) -> list[str]:
    """Local addresses of the TCP sockets listening, and UDP sockets bound, in `pid` and its descendants."""
    from pathlib import Path

    pids, inodes = [pid], set()
    while pids:
        p = pids.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            pids += [int(c) for c in (task / "children").read_text().split()]
        for fd in Path(f"/proc/{p}/fd").glob("*"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    found = []
    for table, listening in (("tcp", "0A"), ("tcp6", "0A"), ("udp", None), ("udp6", None)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[9] in inodes and (listening is None or cols[3] == listening):
                found.append(f"{table} {_address(cols[1])}")
    return found


def _address(hex_address: str) -> str:
    import ipaddress
    import struct

    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = struct.unpack(f"<{len(raw) // 4}I", raw)  # /proc/net writes each 32-bit word host-endian
    packed = b"".join(struct.pack(">I", w) for w in words)
    return f"{ipaddress.ip_address(packed)}:{int(port, 16)}"


def test_no_worker_listens_beyond_loopback(pd):
    """HTTP, metrics, bootstrap and NIXL/UCX sockets of both workers (and their processes) bind loopback."""
    import ipaddress

    _, prefill, decode = pd
    for worker in (prefill, decode):
        found = _listening(worker.proc.pid)
        assert len(found) >= 3, found  # HTTP, metrics, UCX (and the prefill worker's bootstrap port)
        wide = [a for a in found if not ipaddress.ip_address(a.split()[1].rsplit(":", 1)[0]).is_loopback]
        assert not wide, found


def test_after_the_adversaries_pd_still_equals_a_single_worker(pd, sglang_server):
    test_mixed_batch_equals_a_single_worker(pd, sglang_server)
    _no_leak(pd[1], 10)
    _no_leak(pd[2], 10)


# --------------------------------------------------------------------------- failures


@pytest.fixture()
def pair(tiny_model) -> Iterator[tuple[Server, Server, int]]:
    prefill, decode, port = _pair(str(tiny_model("llama")), "--chunked-prefill-size", "16")
    yield prefill, decode, port
    for s in (prefill, decode):
        if s.proc.poll() is None:
            stop_server(s)


def _headers(key: str) -> dict[str, str]:
    return {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}


def _boot(port: int, room: int) -> dict:
    return {"bootstrap_host": "127.0.0.1", "bootstrap_port": port, "bootstrap_room": room}


def test_abort_while_waiting_for_the_kv(pair):
    """The client goes away while the decode worker waits for KV that never comes (the
    prefill worker never got the request): the slots come back as soon as the prefill worker
    confirms the cancel, well before the timeout."""
    prefill, decode, port = pair
    body = {"text": "word " * 200, "sampling_params": {"max_new_tokens": 4}, **_boot(port, 11)}
    conn = http.client.HTTPConnection(decode.host, decode.port, timeout=1)
    conn.request("POST", "/generate", body=json.dumps(body), headers=_headers(SECRET))
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()  # the client hangs up: the decode worker aborts the request
    _no_leak(decode, TIMEOUT_S - 1)
    _no_leak(prefill, 5)


def test_abort_on_the_prefill_worker_fails_the_decode_side_fast(pair):
    """The prefill worker's copy is aborted while it prefills: its decode worker hears so
    at once (not at its timeout) and both pools are whole again."""
    prefill, decode, port = pair
    body = {"text": "word " * 1500, "sampling_params": {"max_new_tokens": 4}, **_boot(port, 14)}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        t0 = time.monotonic()
        decoding = pool.submit(_generate, decode, body)
        time.sleep(0.3)  # the decode worker's pull waits on the prefill worker
        prefilling = pool.submit(_generate, prefill, {**body, "rid": "pd-abort"})
        time.sleep(0.1)
        assert prefill.request("POST", "/abort_request", {"rid": "pd-abort"}, key=SECRET)[0] == 200
        status, out = decoding.result(timeout=4 * TIMEOUT_S)
        assert time.monotonic() - t0 < TIMEOUT_S
        aborted = prefilling.result(timeout=4 * TIMEOUT_S)[1]
    assert aborted["meta_info"]["finish_reason"]["type"] == "abort", aborted
    assert status == 502 and "the prefill worker" in out["error"]["message"], out
    _no_leak(decode, 5)
    _no_leak(prefill, 5)


def test_prefill_without_a_decode_worker_times_out_cleanly(pair):
    prefill, _, port = pair
    status, body = _generate(
        prefill, {"text": "Nobody pulls", "sampling_params": {"max_new_tokens": 4}, **_boot(port, 12)}
    )
    assert status == 504 and "no decode worker asked" in body["error"]["message"], body
    _no_leak(prefill, 5)


def test_killed_prefill_worker_does_not_wedge_the_decode_worker(pair):
    prefill, decode, port = pair
    body = {"text": "word " * 300, "sampling_params": {"max_new_tokens": 4}, **_boot(port, 13)}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = pool.submit(_generate, decode, body)
        time.sleep(0.5)
        stop_process(prefill.proc, signal.SIGKILL, 5)
        status, out = waiting.result(timeout=4 * TIMEOUT_S)
    assert status == 504 and "did not arrive from the prefill worker" in out["error"]["message"], out
    assert decode.request("GET", "/health", key=None)[0] == 200
    _no_leak(decode, 2 * TIMEOUT_S)
