"""Process lifecycle: clean start-up and shutdown, no orphans, a clear error when a child dies."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import pytest

from arbor.runtime.engine import Engine
from arbor.runtime.io.tokenizer_manager import EngineDead


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` has exited (and been reaped) within the time given."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_shutdown_leaves_no_processes_or_socket_files(tiny_model):
    engine = Engine(str(tiny_model("llama")), dtype="float32")
    socket_dir = engine.children.ipc.path
    assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in socket_dir.iterdir()) == ["detokenizer", "front", "heartbeat", "scheduler"]
    pids = engine.children.pids()
    assert len(engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})["output_ids"]) <= 2
    engine.shutdown()
    engine.shutdown()  # idempotent
    assert all(gone(pid) for pid in pids.values())
    assert not socket_dir.exists()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate(input_ids=[1, 2, 3])


def test_killed_scheduler_fails_requests_and_stops_the_engine(tiny_model):
    engine = Engine(str(tiny_model("llama")), dtype="float32")
    pids = engine.children.pids()
    stream = engine.generate(
        input_ids=list(range(10, 50)), sampling_params={"max_new_tokens": 1500, "ignore_eos": True}, stream=True
    )
    next(stream)
    os.kill(pids["scheduler"], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(EngineDead, match=r"scheduler process exited unexpectedly \(exit code -9\)"):
        for _ in stream:
            pass
    assert time.monotonic() - t0 < 5
    assert gone(pids["detokenizer"])  # the survivor is stopped, not orphaned
    with pytest.raises(EngineDead, match="engine has stopped"):
        engine.generate(input_ids=[1, 2])
    socket_dir = engine.children.ipc.path
    engine.shutdown()
    assert not socket_dir.exists()


def test_child_that_fails_to_start_is_reported(tiny_model, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    src = Path(tiny_model("llama"))
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    before = set(os.listdir("/proc"))
    with pytest.raises(EngineDead, match="scheduler process failed to start"):
        Engine(str(broken), dtype="float32")
    time.sleep(0.5)
    children = [p for p in set(os.listdir("/proc")) - before if p.isdigit() and _is_arbor_child(p)]
    assert children == []


def _is_arbor_child(pid: str) -> bool:
    try:
        return b"arbor.runtime.io.processes" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
