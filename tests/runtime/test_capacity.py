"""A full cache never wedges the scheduler: second turns of chats whose first turns fill the
pool all finish, equal to a roomy pool's outputs, with prompt logprobs intact."""

from __future__ import annotations

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.messages import (
    FinishLength,
    ReqOut,
    TokenizedGenerateReq,
    pack_ids,
    unpack_ids,
)
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.scheduler.scheduler import Scheduler

MAX_STEPS = 2000


def _req(rid: str, ids: list[int], n: int, logprob_start: int = -1) -> TokenizedGenerateReq:
    return TokenizedGenerateReq(
        rid=rid,
        input_ids=pack_ids(ids),
        sampling=SamplingParams(max_new_tokens=n, temperature=0, ignore_eos=True),
        return_logprob=logprob_start >= 0,
        logprob_start_len=logprob_start,
    )


def _drain(sched: Scheduler) -> list[ReqOut]:
    outs: list[ReqOut] = []
    for _ in range(MAX_STEPS):
        if not sched.has_work:
            return outs
        outs += sched.step()
    raise AssertionError(
        f"no progress after {MAX_STEPS} steps: running {len(sched.running)}, waiting "
        f"{len(sched.waiting)}, free {sched.kv.allocator.available()}"
    )


def _chats(sched: Scheduler, chats: int, prompt: int, logprob_start: int = -1) -> dict[str, tuple]:
    """Two turns of `chats` conversations; rid -> (output ids, finish reason, prompt logprobs)."""
    firsts = {f"c{c}": [1000 + 97 * c + i for i in range(prompt)] for c in range(chats)}
    for rid, ids in firsts.items():
        sched.add(_req(rid, ids, 8))
    done = {o.rid: o for o in _drain(sched) if o.finish_reason is not None}
    outs: list[ReqOut] = []
    for rid, ids in firsts.items():
        answer = [t for o in [done[rid]] for t in unpack_ids(o.new_ids)]
        sched.add(_req(rid + "-2", ids + answer + [7, 8, 9], 8, logprob_start))
    outs = _drain(sched)
    result = {}
    for rid in (r + "-2" for r in firsts):
        mine = [o for o in outs if o.rid == rid]
        ids = [t for o in mine for t in unpack_ids(o.new_ids)]
        result[rid] = (ids, mine[-1].finish_reason, [x for o in mine for x in o.input_logprobs])
    assert sched.check_invariant() is None
    return result


def test_second_turns_of_chats_that_filled_the_pool_all_finish(tiny_model):
    # Ten 1,000-token chats in a 10,000-token pool: the second turns once waited for ever.
    path = str(tiny_model("llama"))
    tight = Scheduler(ServerArgs.from_flags(device="cpu", dtype="float32", max_total_tokens=10_000), path)
    roomy = Scheduler(ServerArgs.from_flags(device="cpu", dtype="float32", max_total_tokens=40_000), path)
    got, want = _chats(tight, 10, 1000), _chats(roomy, 10, 1000)
    assert got == want
    assert all(reason == FinishLength(length=8) for _, reason, _ in got.values())


def test_prompt_logprobs_survive_a_tight_pool(tiny_model):
    path = str(tiny_model("llama"))
    tight = Scheduler(ServerArgs.from_flags(device="cpu", dtype="float32", max_total_tokens=1100), path)
    roomy = Scheduler(ServerArgs.from_flags(device="cpu", dtype="float32", max_total_tokens=20_000), path)
    got, want = _chats(tight, 5, 200, logprob_start=150), _chats(roomy, 5, 200, logprob_start=150)
    assert got == want
    assert all(len(lps) == 200 + 8 + 3 - 150 for _, _, lps in got.values())
