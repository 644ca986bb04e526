"""A request's status is stated at each transition and names where it is: WAITING requests are
in the waiting queue, RUNNING ones in the running batch, a PREFILLING one between steps is the
prompt being chunked, and a FINISHED one is nowhere (its KV freed)."""

from __future__ import annotations

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.messages import FinishAbort, TokenizedGenerateReq, pack_ids
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.scheduler.req import Req, ReqStatus
from arbor.runtime.scheduler.scheduler import Scheduler


def _scheduler(model: str, **flags) -> Scheduler:
    return Scheduler(
        ServerArgs.from_flags(device="cpu", attention_backend="torch", dtype="float32", **flags),
        model,
    )


def _add(sched: Scheduler, rid: str, prompt: list[int], n: int) -> list[Req]:
    sched.add(
        TokenizedGenerateReq(
            rid=rid,
            input_ids=pack_ids(prompt),
            sampling=SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True),
        )
    )
    return [r for r in sched.waiting if r.group == rid]


def _check_where(sched: Scheduler, reqs: list[Req]) -> None:
    for req in reqs:
        assert (req in sched.waiting) == (req.status is ReqStatus.WAITING), req.rid
        assert (req in sched.running) == (req.status is ReqStatus.RUNNING), req.rid
        assert (req is sched.admission.chunked) == (req.status is ReqStatus.PREFILLING), req.rid
        assert (req.status is ReqStatus.FINISHED) == (req.finish_reason is not None), req.rid
        assert (req.row >= 0) == (req.status in (ReqStatus.PREFILLING, ReqStatus.RUNNING)), req.rid


def test_statuses_follow_prefill_chunks_decode_retraction_and_finish(tiny_model):
    # A pool too small for all three at once (admission expects each to need 70% of its
    # tokens), so decoding runs out of KV and retracts; a long prompt is chunked.
    sched = _scheduler(str(tiny_model("llama")), max_total_tokens=100, chunked_prefill_size=16)
    reqs = [r for i in range(3) for r in _add(sched, f"r{i}", [100 + 10 * i + j for j in range(10)], 30)]
    reqs += _add(sched, "long", list(range(200, 240)), 4)
    assert all(r.status is ReqStatus.WAITING for r in reqs)
    seen: dict[str, list[ReqStatus]] = {r.rid: [r.status] for r in reqs}
    for _ in range(500):
        if not sched.has_work:
            break
        sched.step()
        _check_where(sched, reqs)
        for r in reqs:
            if seen[r.rid][-1] is not r.status:
                seen[r.rid].append(r.status)
    assert not sched.has_work and sched.check_invariant() is None
    assert sched.stats.retractions > 0
    retracted = [
        rid for rid, path in seen.items() if path[:3] == [ReqStatus.WAITING, ReqStatus.RUNNING, ReqStatus.WAITING]
    ]
    assert retracted and all(seen[rid][-1] is ReqStatus.FINISHED for rid in seen)
    assert ReqStatus.PREFILLING in seen["long"]


def test_abort_finishes_a_request_wherever_it_is(tiny_model):
    sched = _scheduler(str(tiny_model("llama")))
    [running] = _add(sched, "running", [5, 6, 7], 20)
    sched.step()
    [waiting] = _add(sched, "waiting", [8, 9], 20)
    assert running.status is ReqStatus.RUNNING and waiting.status is ReqStatus.WAITING
    for req in (waiting, running):
        [out] = sched.abort(req.rid)
        assert isinstance(out.finish_reason, FinishAbort) and req.status is ReqStatus.FINISHED
        _check_where(sched, [running, waiting])
    assert not sched.has_work and sched.check_invariant() is None
