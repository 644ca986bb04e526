"""Admission plans a step as a value: for a given queue state, the mode, the rows (request,
end, inputs), and what to do when the KV does not fit; and the state it carries between steps
(the chunked prompt, one-at-a-time after a failed reservation)."""

from __future__ import annotations

from array import array

import torch

from arbor.runtime.config import CacheArgs, ServerArgs
from arbor.runtime.kv.manager import KVManager, make_prefix_cache
from arbor.runtime.kv.pool import PageAllocator, ReqToTokenPool
from arbor.runtime.model.forward_batch import ForwardMode
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.scheduler.admission import Admission
from arbor.runtime.scheduler.req import Req, ReqStatus
from arbor.runtime.scheduler.stats import SchedulerStats
from arbor.runtime.scheduler.step_plan import OnNoKV, StepMode

CONTEXT = 256


def _admission(**flags) -> Admission:
    kv = KVManager(
        PageAllocator(1024, 1),
        ReqToTokenPool(8, CONTEXT, torch.device("cpu")),
        make_prefix_cache(CacheArgs()),
    )
    return Admission(ServerArgs.from_flags(**flags).scheduler, kv, CONTEXT, SchedulerStats())


def _waiting(rid: str, prompt: list[int], arrival: int, **params) -> Req:
    return Req(rid, array("i", prompt), SamplingParams(max_new_tokens=4, **params), arrival=arrival)


def _running(adm: Admission, rid: str, prompt: list[int], output: list[int]) -> Req:
    """A decoding request: prompt and all but its last output token have K/V."""
    req = Req(
        rid,
        array("i", prompt),
        SamplingParams(max_new_tokens=8),
        output_ids=list(output),
        status=ReqStatus.RUNNING,
    )
    assert adm.kv.attach(req)
    assert adm.kv.reserve([req], [req.seq_len - 1]) is not None
    req.kv_len = req.seq_len - 1
    return req


def test_nothing_queued_plans_an_idle_step():
    plan = _admission().plan([], [])
    assert plan.mode is StepMode.IDLE and plan.reqs == ()


def test_waiting_prompts_alone_plan_a_prefill_of_each_whole_prompt():
    adm = _admission()
    a, b = _waiting("a", [1, 2, 3], 1), _waiting("b", [4, 5, 6, 7], 2)
    plan = adm.plan([a, b], [])
    assert plan.mode is StepMode.PREFILL and plan.forward_mode is ForwardMode.EXTEND
    assert plan.reqs == (a, b) and plan.ends == (3, 4) and plan.inputs == ([1, 2, 3], [4, 5, 6, 7])
    assert plan.num_prefill == 2 and plan.decode == () and not plan.all_logits
    assert plan.on_no_kv is OnNoKV.REQUEUE
    assert a.status is b.status is ReqStatus.PREFILLING and adm.stats.prompt_tokens == 7


def test_prompts_arriving_while_others_decode_ride_in_one_mixed_step():
    adm = _admission()
    run = _running(adm, "r", [9, 9, 9], [11, 12])
    new = _waiting("n", [1, 2, 3], 2)
    plan = adm.plan([new], [run])
    assert plan.mode is StepMode.MIXED and plan.forward_mode is ForwardMode.MIXED
    assert plan.prefill == (new,) and plan.decode == (run,)
    assert plan.ends == (3, 5) and plan.inputs == (
        [1, 2, 3],
        [12],
    )  # the decode row feeds its last token
    assert plan.on_no_kv is OnNoKV.REQUEUE


def test_without_mixed_steps_prompts_prefill_alone_and_running_requests_decode_with_retraction():
    adm = _admission(enable_mixed_chunk=False)
    run = _running(adm, "r", [9, 9, 9], [11])
    new = _waiting("n", [1, 2, 3], 2)
    assert adm.plan([new], [run]).mode is StepMode.PREFILL
    plan = adm.plan([], [run])
    assert plan.mode is StepMode.DECODE and plan.forward_mode is ForwardMode.DECODE
    assert plan.reqs == (run,) and plan.ends == (4,) and plan.inputs == ([11],)
    assert plan.on_no_kv is OnNoKV.RETRACT


def test_a_jump_forward_makes_the_decode_step_an_extend_of_the_forced_tokens():
    adm = _admission()
    run = _running(adm, "r", [9, 9, 9], [11, 12, 13])  # 12 and 13 were forced after 11
    run.kv_len = 3
    plan = adm.plan([], [run])
    assert plan.forward_mode is ForwardMode.EXTEND and plan.inputs == ([11, 12, 13],)


def test_a_long_prompt_is_chunked_and_goes_on_next_step():
    adm = _admission(chunked_prefill_size=8, enable_mixed_chunk=False)
    long = _waiting("long", list(range(1, 21)), 1)
    plan = adm.plan([long], [])
    assert plan.ends == (8,) and plan.inputs == (list(range(1, 9)),)
    long.kv_len = 8
    adm.prefilled(plan)
    assert adm.chunked is long and long.status is ReqStatus.PREFILLING
    run = _running(adm, "r", [9, 9], [11])
    assert adm.plan([], [run]).mode is StepMode.DECODE, "a decode step between two chunks"
    plan = adm.plan([], [run])
    assert plan.mode is StepMode.PREFILL and plan.reqs == (long,) and plan.ends == (16,)


def test_prompt_logprobs_take_a_prefill_step_of_their_own_with_every_logit():
    adm = _admission()
    run = _running(adm, "r", [9, 9, 9], [11])
    req = _waiting("lp", [1, 2, 3, 4], 2)
    req.logprob_start = 0
    plan = adm.plan([req], [run])
    assert plan.mode is StepMode.PREFILL and plan.all_logits


def test_after_a_failed_reservation_one_request_is_admitted_at_a_time():
    adm = _admission()
    reqs = [_waiting(str(i), [i + 1, i + 2], i) for i in range(3)]
    adm.requeued()
    plan = adm.plan(reqs, [])
    assert plan.reqs == (reqs[0],)
    adm.reserved()
    waiting = [r for r in reqs if r.status is ReqStatus.WAITING]
    assert adm.plan(waiting, []).reqs == tuple(reqs[1:])
