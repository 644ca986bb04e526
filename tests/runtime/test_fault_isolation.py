"""Fault isolation: a batch whose forward raises ends only its own requests (each with the
error), every other request finishes as if nothing happened, and the KV invariant holds."""

from __future__ import annotations

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.messages import (
    FinishAbort,
    FinishLength,
    ReqOut,
    TokenizedGenerateReq,
    pack_ids,
)
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.scheduler.scheduler import Scheduler


def _req(rid: str, ids: list[int], n: int) -> TokenizedGenerateReq:
    return TokenizedGenerateReq(
        rid=rid, input_ids=pack_ids(ids), sampling=SamplingParams(max_new_tokens=n, temperature=0)
    )


def _run(sched: Scheduler, outs: list[ReqOut]) -> dict[str, ReqOut]:
    while sched.has_work:
        outs += sched.step()
    return {o.rid: o for o in outs if o.finish_reason is not None}


def _ids(outs: list[ReqOut], rid: str) -> list[int]:
    from arbor.runtime.io.messages import unpack_ids

    return [t for o in outs if o.rid == rid for t in unpack_ids(o.new_ids)]


def test_a_failing_forward_ends_only_its_batch(tiny_model):
    # Without mixed batches the victim's prefill is a batch of its own.
    args = ServerArgs.from_flags(device="cpu", attention_backend="torch", dtype="float32", enable_mixed_chunk=False)
    clean = Scheduler(args, str(tiny_model("llama")))
    clean.add(_req("steady", [11, 12, 13, 14], 6))
    clean_outs: list[ReqOut] = []
    _run(clean, clean_outs)

    sched = Scheduler(args, str(tiny_model("llama")))
    sched.add(_req("steady", [11, 12, 13, 14], 6))
    outs = sched.step()  # steady's prefill; it decodes from now on
    sched.add(_req("victim", [21, 22, 23], 4))
    forward, faults = sched.runner.forward, []

    def flaky(batch):
        if not faults:
            faults.append(batch)
            raise RuntimeError("injected fault")
        return forward(batch)

    sched.runner.forward = flaky
    outs += sched.step()  # the victim's prefill raises
    finished = _run(sched, outs)
    victim = finished["victim"].finish_reason
    assert isinstance(victim, FinishAbort) and victim.status_code == 500 and "injected fault" in victim.message
    assert finished["steady"].finish_reason == FinishLength(length=6)
    assert _ids(outs, "steady") == _ids(clean_outs, "steady")
    assert sched.check_invariant() is None and sched.stats.failed_batches == 1

    sched.add(_req("after", [21, 22, 23], 4))  # the same prompt again: served normally
    after: list[ReqOut] = []
    assert _run(sched, after)["after"].finish_reason == FinishLength(length=4)
    assert sched.check_invariant() is None


def test_a_failing_mixed_step_ends_its_prefill_and_decode_rows_and_serving_goes_on(tiny_model):
    sched = Scheduler(
        ServerArgs.from_flags(device="cpu", attention_backend="torch", dtype="float32"), str(tiny_model("llama"))
    )
    sched.add(_req("steady", [11, 12, 13, 14], 6))
    outs = sched.step()
    sched.add(_req("victim", [21, 22, 23], 4))
    forward, faults = sched.runner.forward, []

    def flaky(batch):
        if not faults:
            faults.append(batch.mode)
            raise RuntimeError("injected fault")
        return forward(batch)

    sched.runner.forward = flaky
    finished = _run(sched, outs)
    assert faults[0].value == "mixed", "the victim's prefill rode with steady's decode step"
    for rid in ("steady", "victim"):
        reason = finished[rid].finish_reason
        assert isinstance(reason, FinishAbort) and "injected fault" in reason.message
    assert len(_ids(outs, "steady")) == 1, "steady keeps the token it had before the failed step"
    assert sched.check_invariant() is None
    sched.add(_req("after", [21, 22, 23], 4))
    assert _run(sched, [])["after"].finish_reason == FinishLength(length=4)
    assert sched.check_invariant() is None


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of every direct child of `pid`."""
    from pathlib import Path

    out = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    out[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue
    return out


def test_a_killed_scheduler_takes_arbor_serve_down_non_zero(tiny_model):
    import os
    import signal
    import subprocess

    from tests.server.conftest import start_server, stop_server

    server = start_server(str(tiny_model("llama")))
    try:
        [scheduler] = [pid for pid, cmd in _children(server.proc.pid).items() if "processes scheduler" in cmd]
        os.kill(scheduler, signal.SIGKILL)
        code = server.proc.wait(20)
    except subprocess.TimeoutExpired:
        stop_server(server)
        raise AssertionError("arbor serve kept running with a dead scheduler") from None
    assert code == 1
