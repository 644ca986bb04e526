"""A live `arbor serve` on 127.0.0.1 (tiny checkpoint, fp32), and small HTTP helpers."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

API_KEY = "test-key"


@dataclass
class Server:
    host: str
    port: int
    model: str
    proc: subprocess.Popen
    key: str = API_KEY

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        raw: bytes | None = None,
        key: str | None = API_KEY,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """One HTTP request; returns (status, parsed JSON or text)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if key is not None:
            hdrs["Authorization"] = f"Bearer {key}"
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        try:
            return resp.status, json.loads(text)
        except json.JSONDecodeError:
            return resp.status, text

    def sse(self, path: str, body: Any) -> list[str]:
        """The `data:` payloads of a streamed response, in order (including `[DONE]`)."""
        status, text = self.request("POST", path, body)
        assert status == 200, text
        assert isinstance(text, str)
        events = [chunk for chunk in text.split("\n\n") if chunk]
        assert all(e.startswith("data: ") for e in events), events
        return [e[len("data: ") :] for e in events]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_path: str, *extra: str, env: dict[str, str] | None = None) -> Server:
    """`arbor serve` on a free 127.0.0.1 port; `env` adds to the environment (keys, secrets)."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "arbor",
        "serve",
        "--model-path",
        model_path,
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--log-level",
        "warning",
        *extra,
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, **env} if env else None)
    server = Server("127.0.0.1", port, os.path.basename(model_path), proc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"arbor serve exited with {proc.returncode}")
        try:
            if server.request("GET", "/health", key=None)[0] == 200:
                return server
        except OSError:
            pass
        time.sleep(0.3)
    stop_server(server)
    raise RuntimeError("arbor serve did not become healthy in 120 s")


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = 30) -> None:
    """Ask a process to exit with `sig`; kill it if it has not within `timeout_s`."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_server(server: Server) -> None:
    stop_process(server.proc)


@pytest.fixture(scope="session")
def server(tiny_model) -> Iterator[Server]:
    s = start_server(
        str(tiny_model("llama")), "--api-key", API_KEY, "--max-body-bytes", "200000", "--enable-cache-report"
    )
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture
def launch(tiny_model):
    """launch(*flags) -> a Server on the tiny checkpoint, stopped after the test."""
    started: list[Server] = []

    def start(*flags: str) -> Server:
        started.append(start_server(str(tiny_model("llama")), *flags))
        return started[-1]

    yield start
    for s in started:
        stop_server(s)
