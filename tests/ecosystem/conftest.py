"""Arbor next to the ecosystem's own clients: live `arbor serve` workers, and the unmodified
`sglang-router` (a Rust binary from the package registry) in front of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from tests.server.conftest import Server, _free_port, start_server, stop_process, stop_server

KEY = "ecosystem-key"


@dataclass
class Router:
    """A running sglang-router and the Arbor workers behind it."""

    proc: subprocess.Popen
    url: str
    workers: list[Server]
    api_key: str | None = None

    @property
    def front(self) -> Server:
        """The router, spoken to with the same helpers as a worker (the workers have no key)."""
        host, port = self.url.removeprefix("http://").split(":")
        return Server(host, int(port), self.workers[0].model, self.proc, key=self.api_key or "")


@pytest.fixture(scope="session")
def sglang_server(tiny_model) -> Iterator[Server]:
    server = start_server(str(tiny_model("llama")), "--api-key", KEY)
    yield server
    stop_server(server)


def chat_trace(client: openai.OpenAI, model: str, conversations: int = 4, turns: int = 3) -> list[list[int]]:
    """cached_tokens of every turn of every conversation, turns interleaved across them."""
    history = [
        [{"role": "user", "content": f"Conversation {c}: tell me about topic {c * 7}."}] for c in range(conversations)
    ]
    cached: list[list[int]] = [[] for _ in range(conversations)]
    for turn in range(turns):
        for c in range(conversations):
            reply = client.chat.completions.create(model=model, messages=history[c], max_tokens=12, temperature=0)
            cached[c].append(reply.usage.prompt_tokens_details.cached_tokens)
            history[c] += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"Go on about part {turn + 1}."},
            ]
    return cached


# sglang-router takes its key only as --api-key: this launcher adds it inside the process, from
# the environment, so it never shows in the process list.
_KEYED_LAUNCH = (
    "import os, sys; from sglang_router.launch_router import main; "
    "sys.argv += ['--api-key', os.environ.pop('ROUTER_API_KEY')]; main()"
)


def start_router(
    workers: list[Server],
    timeout_s: float = 120.0,
    pd: tuple[Server, int, Server] | None = None,
    api_key: str | None = None,
) -> Router:
    """sglang-router with the cache_aware policy on 127.0.0.1; ready once it lists the model.
    With `pd` = (prefill worker, its bootstrap port, decode worker): PD-disaggregation mode.
    With `api_key`: the router sends it to the workers and asks its clients for it."""
    port = _free_port()
    launch = ["-c", _KEYED_LAUNCH] if api_key else ["-m", "sglang_router.launch_router"]
    cmd = [
        sys.executable,
        *launch,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "cache_aware",
        "--log-level",
        "warn",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(_free_port()),
    ]
    if pd is None:
        cmd += ["--worker-urls", *[w.base_url for w in workers]]
    else:
        cmd += ["--pd-disaggregation", "--prefill", pd[0].base_url, str(pd[1]), "--decode", pd[2].base_url]
    env = {**os.environ, "ROUTER_API_KEY": api_key} if api_key else None
    proc = subprocess.Popen(cmd, env=env)
    router = Router(proc, f"http://127.0.0.1:{port}", workers, api_key)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang-router exited with {proc.returncode}")
        try:
            status, body = router.front.request("GET", "/v1/models", key=api_key)
            if status == 200 and [m["id"] for m in body["data"]] == [workers[0].model]:
                return router
        except OSError:
            pass
        time.sleep(0.5)
    stop_router(router)
    raise RuntimeError(f"sglang-router did not list the workers' model in {timeout_s:.0f} s")


def stop_router(router: Router) -> None:
    stop_process(router.proc, signal.SIGTERM, 15)


@pytest.fixture(scope="session")
def router(tiny_model) -> Iterator[Router]:
    workers = [start_server(str(tiny_model("llama")), "--enable-cache-report") for _ in range(2)]
    try:
        r = start_router(workers)
    except BaseException:
        for w in workers:
            stop_server(w)
        raise
    yield r
    stop_router(r)
    for w in workers:
        stop_server(w)
