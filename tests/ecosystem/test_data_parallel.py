"""`arbor serve --dp-size 2`: two workers and the unmodified sglang-router in front, reached by
the native API, the official OpenAI client and the unmodified sglang frontend; conversations
keep the cache hits one worker gives them; a dead worker stops the whole server."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import openai
import psutil
import pytest
import sglang as sgl
from sglang.test import test_programs as programs

from tests.ecosystem.conftest import Router, chat_trace
from tests.server.conftest import API_KEY as KEY
from tests.server.conftest import Server, start_server, stop_process, stop_server


def _workers(fleet: Server) -> list[psutil.Process]:
    """The worker servers the launcher started (not their schedulers, not the router)."""
    children = psutil.Process(fleet.proc.pid).children()
    return [p for p in children if "arbor" in p.cmdline() and "serve" in p.cmdline()]


def _ready(fleet: Server, timeout_s: float = 60) -> Server:
    """Wait until the router lists the model (both workers registered)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, body = fleet.request("GET", "/v1/models", key=KEY)
        if status == 200 and body["data"]:
            return fleet
        time.sleep(0.5)
    raise RuntimeError("the router never listed the model")


@pytest.fixture(scope="module")
def fleet(tiny_model) -> Iterator[Server]:
    server = _ready(start_server(str(tiny_model("llama")), "--dp-size", "2", "--enable-cache-report", "--api-key", KEY))
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def client(fleet: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.base_url + "/v1", api_key=KEY, max_retries=0)


def test_two_workers_each_with_half_the_cores(fleet):
    workers = _workers(fleet)
    assert len(workers) == 2
    for w in workers:
        cmd = w.cmdline()
        assert cmd[cmd.index("--num-threads") + 1] == str(max(1, psutil.cpu_count() // 2))
        assert "--host" not in cmd  # the default, 127.0.0.1: workers are reached through the router only
        assert KEY not in " ".join(cmd)  # the key travels in the environment
    router = [p for p in psutil.Process(fleet.proc.pid).children() if p not in workers]
    assert len(router) == 1 and KEY not in " ".join(router[0].cmdline())


def test_the_key_is_required_at_the_front(fleet):
    status, body = fleet.request(
        "POST", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}, key=None
    )
    assert status == 401, body
    status, _ = fleet.request(
        "POST", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}, key="wrong"
    )
    assert status == 401


def test_native_generate_equals_a_single_worker(fleet, router: Router):
    single = router.workers[0]
    for prompt in ("Hello", "The quick brown fox", "1 2 3 4"):
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        status, out = fleet.request("POST", "/generate", body, key=KEY)
        assert status == 200, out
        assert out["output_ids"] == single.request("POST", "/generate", body)[1]["output_ids"]
    events = fleet.sse(
        "/generate", {"text": "Hello", "stream": True, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    )
    assert events[-1] == "[DONE]"


def test_openai_chat_streamed_and_not(client, fleet):
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Say something."}]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 6
    chunks = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
    assert client.chat.completions.create(model=model, messages=messages).choices[0].finish_reason in ("stop", "length")


# Not select: the frontend scores choices with one batched /generate (a list of texts), which
# sglang-router refuses with 422 before any worker sees it (tests/ecosystem/test_router.py).
@pytest.mark.parametrize("program", [programs.test_mt_bench, programs.test_parallel_decoding, programs.test_regex])
def test_the_sglang_frontend_runs_through_the_fleet(fleet, program):
    sgl.set_default_backend(sgl.RuntimeEndpoint(fleet.base_url, api_key=KEY))
    try:
        program()
    finally:
        sgl.set_default_backend(None)


def test_conversations_keep_their_cache_hits(client, fleet, router: Router):
    model = client.models.list().data[0].id
    single = router.workers[0]
    single.request("POST", "/flush_cache")
    alone = chat_trace(openai.OpenAI(base_url=single.base_url + "/v1", api_key="none", max_retries=0), model)
    assert fleet.request("POST", "/flush_cache", key=KEY)[0] == 200
    through_fleet = chat_trace(client, model)
    later = sum(sum(hits[1:]) for hits in alone)
    assert later > 0
    assert sum(sum(hits[1:]) for hits in through_fleet) >= 0.9 * later, (through_fleet, alone)


def test_workers_report_load_and_cache(fleet, router: Router):
    worker = router.workers[0]
    status, load = worker.request("GET", "/get_load")
    assert status == 200 and set(load[0]) >= {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"}
    info = worker.request("GET", "/get_server_info")[1]
    assert info["tp_size"] == 1 and info["dp_size"] == 1 and "cache_hit_rate" in info["stats"]
    metrics = worker.request("GET", "/metrics")[1]
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate"):
        assert name in metrics


def test_a_killed_worker_stops_the_server(tiny_model):
    server = _ready(start_server(str(tiny_model("llama")), "--dp-size", "2", "--api-key", KEY))
    try:
        survivor, victim = _workers(server)
        victim.send_signal(signal.SIGKILL)
        assert server.proc.wait(timeout=60) == 1
        survivor.wait(timeout=30)  # stopped by the supervisor, not left behind
    finally:
        stop_process(server.proc, signal.SIGTERM)


def test_dp_without_the_router_is_a_clear_error(tiny_model):
    # An interpreter where sglang_router cannot be imported (None in sys.modules blocks it).
    code = (
        "import sys; sys.modules['sglang_router'] = None; "
        "sys.argv = ['arbor', 'serve', '--dp-size', '2', '--model-path', sys.argv[1]]; "
        "from arbor.__main__ import main; sys.exit(main())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tiny_model("llama"))], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "sglang-router" in done.stderr
