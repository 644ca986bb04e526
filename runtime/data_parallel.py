"""`arbor serve --dp-size N`: N independent worker servers, and the unmodified sglang-router in
front of them on --host/--port.

Each worker is a whole `arbor serve` (front end, scheduler, its own radix cache) on a free
127.0.0.1 port, with an equal share of the CPU cores. The router's cache_aware policy keeps a
prefix tree of the text it sent to each worker, so later turns of a conversation go where its
KV already is. When any child exits, the rest are stopped and the command exits non-zero.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.processes import free_port

logger = logging.getLogger("arbor.dp")
WORKER_READY_S = 900.0  # loading a large checkpoint (and compiling CPU kernels) takes minutes
ROUTER_READY_S = 120.0
STOP_GRACE_S = 15.0
POLL_S = 0.5
# sglang-router takes its worker key only as --api-key. It is added to sys.argv inside the
# router's process, so /proc/PID/cmdline (readable by every local user) never shows it.
ROUTER_MAIN = (
    "import os, runpy, sys\n"
    "key = os.environ.pop('ARBOR_ROUTER_API_KEY', None)\n"
    "sys.argv[1:] += ['--api-key', key] if key else []\n"
    "runpy.run_module('sglang_router.launch_router', run_name='__main__')"
)
ROUTER_LOG_LEVEL = {"debug": "debug", "info": "info", "warning": "warn", "error": "error"}


@dataclass
class Fleet:
    """The worker servers and the router, as child processes."""

    workers: list[subprocess.Popen] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)
    router: subprocess.Popen | None = None

    def children(self) -> list[tuple[str, subprocess.Popen]]:
        named = [(f"worker {i} ({url})", p) for i, (url, p) in enumerate(zip(self.urls, self.workers, strict=True))]
        return named + ([("sglang-router", self.router)] if self.router is not None else [])

    def exited(self) -> str | None:
        """A description of the first child that has exited, if any."""
        for name, proc in self.children():
            if proc.poll() is not None:
                return f"{name} exited with code {proc.returncode}"
        return None

    def stop(self) -> None:
        """SIGTERM every child (the router first, so no request reaches a stopping worker),
        SIGKILL what is left after the grace period."""
        procs = [p for _, p in reversed(self.children())]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait()


def serve_data_parallel(args: ServerArgs) -> int:
    """Run the fleet until a signal (exit 0) or until a child exits (exit 1, with the reason)."""
    if importlib.util.find_spec("sglang_router") is None:
        print("arbor: error: --dp-size needs sglang-router: pip install 'arbor[router]'", file=sys.stderr)
        return 2
    fleet = Fleet()
    stopping: list[int] = []
    previous = {s: signal.signal(s, lambda sig, _frame: stopping.append(sig)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        reason = _start(args, fleet, stopping.__len__)
        if reason is None and not stopping:
            logger.info(
                "sglang-router (%s) on http://%s:%d in front of %d workers: %s",
                args.router.policy,
                args.http.host,
                args.http.port,
                len(fleet.urls),
                " ".join(fleet.urls),
            )
            while reason is None and not stopping:
                time.sleep(POLL_S)
                reason = fleet.exited()
    finally:
        fleet.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if reason is not None and not stopping:
        print(f"arbor: error: {reason}; the other workers and the router were stopped", file=sys.stderr)
        return 1
    return 0


def _start(args: ServerArgs, fleet: Fleet, stopped: Callable[[], int]) -> str | None:
    """Start the workers, wait until each is healthy, then start the router and wait until it
    lists the model. Returns why that failed, or None."""
    parallel, http, router = args.parallel, args.http, args.router
    threads = parallel.num_threads or max(1, (os.cpu_count() or 1) // (parallel.dp_size * parallel.tp_size))
    env = dict(os.environ)
    if http.api_key:  # in the environment, not in argv, which every local user can read
        env["ARBOR_API_KEY"] = http.api_key
    for i in range(parallel.dp_size):
        port = free_port()
        metrics_port = http.metrics_port + i if http.metrics_port else None  # each worker its own
        flags = args.to_cli_args(
            dp_size=1, host="127.0.0.1", port=port, num_threads=threads, api_key=None, metrics_port=metrics_port
        )
        fleet.workers.append(_spawn([sys.executable, "-m", "arbor", "serve", *flags], env))
        fleet.urls.append(f"http://127.0.0.1:{port}")
    for url in fleet.urls:
        reason = _wait(fleet, url + "/health", WORKER_READY_S, stopped)
        if reason is not None:
            return reason
    command = [
        sys.executable,
        "-c",
        ROUTER_MAIN,
        "--host",
        http.host,
        "--port",
        str(http.port),
        "--policy",
        router.policy,
        "--cache-threshold",
        str(router.cache_threshold),
        "--balance-abs-threshold",
        str(router.balance_abs_threshold),
        "--balance-rel-threshold",
        str(router.balance_rel_threshold),
        "--log-level",
        ROUTER_LOG_LEVEL[args.log_level],
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
        "--worker-urls",
        *fleet.urls,
    ]
    router_env = dict(os.environ)
    if http.api_key:  # what the router sends the workers
        router_env["ARBOR_ROUTER_API_KEY"] = http.api_key
    fleet.router = _spawn(command, router_env)
    return _wait(fleet, f"http://{_local(http.host)}:{http.port}/v1/models", ROUTER_READY_S, stopped, http.api_key)


def _spawn(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A child that gets SIGTERM when this process dies (Linux), so none is left behind."""
    return subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent if sys.platform == "linux" else None)


def _die_with_parent() -> None:
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _wait(fleet: Fleet, url: str, timeout_s: float, stopped: Callable[[], int], key: str | None = None) -> str | None:
    """Poll `url` until it answers 200; None then, else why not."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    while time.monotonic() < deadline:
        if stopped():
            return None
        reason = fleet.exited()
        if reason is not None:
            return reason
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5) as reply:
            if reply.status == 200:
                return None
        time.sleep(POLL_S)
    return f"{url} did not answer within {timeout_s:.0f} s"


def _local(host: str) -> str:
    """Where this machine reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
