"""Start, watch and stop the scheduler and detokenizer processes.

Children are fresh interpreters (`python -m arbor.runtime.io.processes ROLE`, their JSON spec on
stdin), not forks or
multiprocessing spawns: they never re-import the caller's main module (so scripts need no
`if __name__ == "__main__"` guard) and receive only JSON: ServerArgs, paths, endpoints.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import msgspec

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.heartbeat import Heartbeat, HeartbeatBoard
from arbor.runtime.io.ipc import IpcDir

logger = logging.getLogger(__name__)
ENDPOINTS = ("scheduler", "detokenizer", "front")
JOIN_TIMEOUT_S = 5.0


class ChildSpec(msgspec.Struct, kw_only=True):
    """Everything a child process needs, as JSON on its command line."""

    args: ServerArgs
    model_path: str
    tokenizer_path: str
    endpoints: dict[str, str]
    rank: int = 0  # tensor-parallel rank (the scheduler is rank 0)
    tp_port: int = 0  # the tensor-parallel process group's rendezvous port on 127.0.0.1
    heartbeat: str  # the heartbeat slots' file (runtime/io/heartbeat.py)


class ChildProcesses:
    """The child processes of one runtime (scheduler, detokenizer, and with --tp-size N the
    ranks 1..N-1) and the private directory of their sockets.

    Children exit on their own when this process dies.
    """

    def __init__(self, args: ServerArgs, model_path: str, tokenizer_path: str) -> None:
        self.ipc = IpcDir()
        ranks = [tp_endpoint(r) for r in range(1, args.parallel.tp_size)]
        self.endpoints = {name: self.ipc.endpoint(name) for name in (*ENDPOINTS, *ranks)}
        self.heartbeats = HeartbeatBoard(self.ipc.path / "heartbeat")
        # The children never see the API key, and get their spec on stdin, not in argv
        # (which every local user can read in the process list).
        self.spec = ChildSpec(
            args=args.with_flags(api_key=None, api_key_file=None, admin_api_key_file=None),
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            endpoints=self.endpoints,
            tp_port=free_port() if args.parallel.tp_size > 1 else 0,
            heartbeat=str(self.heartbeats.path),
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        ranks = range(1, self.spec.args.parallel.tp_size)
        roles = [("scheduler", 0), ("detokenizer", 0)] + [(f"tp rank {r}", r) for r in ranks]
        for name, rank in roles:
            role = "tp_worker" if rank else name
            proc = subprocess.Popen([sys.executable, "-m", "arbor.runtime.io.processes", role], stdin=subprocess.PIPE)
            assert proc.stdin is not None
            proc.stdin.write(msgspec.json.encode(msgspec.structs.replace(self.spec, rank=rank)))
            proc.stdin.close()
            self.procs[name] = proc

    def dead(self) -> str | None:
        """A message naming the first child that has exited, or None while all run."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                return f"the {name} process exited unexpectedly (exit code {proc.returncode})"
        return None

    def stalled(self, timeout_s: float) -> str | None:
        """A message naming a child whose loop has made no progress in `timeout_s`, or None."""
        return self.heartbeats.stalled(timeout_s)

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def stop(self) -> None:
        """Wait briefly for a clean exit, then terminate and kill; remove the socket directory.
        Safe to call more than once, from any thread."""
        if self.dead() is not None:  # one child died: nothing will tell the others to exit
            for proc in self.procs.values():
                if proc.poll() is None:
                    proc.terminate()
        for name, proc in self.procs.items():
            try:
                proc.wait(JOIN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning("the %s process did not exit in %.0f s; terminating it", name, JOIN_TIMEOUT_S)
                proc.terminate()
                try:
                    proc.wait(JOIN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.heartbeats.close()
        self.ipc.close()


def tp_endpoint(rank: int) -> str:
    """The socket name rank `rank` (>= 1) receives rank 0's batches on."""
    return f"tp{rank}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _main(role: str, raw: bytes) -> None:
    spec = msgspec.json.decode(raw, type=ChildSpec)
    if role == "scheduler":
        from arbor.runtime.scheduler.process import run_scheduler

        run_scheduler(
            spec.args,
            spec.model_path,
            spec.tokenizer_path,
            spec.endpoints,
            Heartbeat(spec.heartbeat, role),
            spec.tp_port,
        )
    elif role == "tp_worker":
        from arbor.runtime.scheduler.tensor_parallel import run_follower

        run_follower(spec.args, spec.model_path, spec.endpoints, spec.rank, spec.tp_port)
    elif role == "detokenizer":
        from arbor.runtime.io.detokenizer import run_detokenizer

        run_detokenizer(spec.tokenizer_path, spec.endpoints, Heartbeat(spec.heartbeat, role))
    else:
        raise SystemExit(f"unknown role {role!r}; expected scheduler, detokenizer or tp_worker")


if __name__ == "__main__":
    _main(sys.argv[1], sys.stdin.buffer.read())
