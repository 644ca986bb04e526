"""/health follows the runtime processes' heartbeats: a stopped scheduler or detokenizer makes it
answer 503 naming the process within --health-heartbeat-timeout-s (and /health_generate with
it, at once), and 200 once it runs again;
an idle server stays healthy."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

TIMEOUT_S = 3


def _child(parent: int, role: str) -> int:
    """The pid of the server's `arbor.runtime.io.processes ROLE` child."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"arbor.runtime.io.processes" in argv and role.encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no {role} child of {parent}")


def _wait_for(server, status: int, within_s: float) -> tuple[int, dict]:
    deadline = time.monotonic() + within_s
    while True:
        got = server.request("GET", "/health", key=None)
        if got[0] == status or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_a_stopped_process_makes_health_503_and_a_resumed_one_200(launch):
    server = launch("--health-heartbeat-timeout-s", str(TIMEOUT_S))
    time.sleep(TIMEOUT_S + 1)  # idle longer than the timeout: the idle loops still beat
    assert server.request("GET", "/health", key=None)[0] == 200
    for role in ("detokenizer", "scheduler"):
        pid = _child(server.proc.pid, role)
        os.kill(pid, signal.SIGSTOP)
        try:
            status, body = _wait_for(server, 503, TIMEOUT_S + 3)
            assert status == 503 and f"the {role} process has made no progress" in body["error"]["message"], body
            started = time.monotonic()  # the probe that generates answers too, and does not hang
            status, body = server.request("GET", "/health_generate")
            assert status == 503 and time.monotonic() - started < TIMEOUT_S + 2, body
        finally:
            os.kill(pid, signal.SIGCONT)
        assert _wait_for(server, 200, 3)[0] == 200
    body = {"text": "a", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    status, out = server.request("POST", "/generate", body)
    assert status == 200 and out["meta_info"]["completion_tokens"] == 4, out
