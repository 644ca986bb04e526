"""StepPlan: one scheduler step as a value. Admission decides it; the Scheduler executes it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from arbor.runtime.model.forward_batch import ForwardMode
from arbor.runtime.scheduler.req import Req


class StepMode(Enum):
    """What a step forwards."""

    IDLE = "idle"  # nothing
    PREFILL = "prefill"  # prompt chunks only; running requests (if any) wait this step
    MIXED = "mixed"  # prompt chunks and a decode step of every running request, in one forward
    DECODE = "decode"  # a decode step of every running request (speculative when a proposer guesses)


class OnNoKV(Enum):
    """What the scheduler does when the plan's KV cannot be reserved."""

    REQUEUE = "requeue"  # put the prompts back (one request at a time from now on); decode instead
    RETRACT = "retract"  # retract the running request with the least progress, then try again


@dataclass(frozen=True)
class StepPlan:
    """The requests of one step, prefill rows first: row i forwards positions
    [reqs[i].kv_len, ends[i]), whose tokens are inputs[i]."""

    mode: StepMode
    forward_mode: ForwardMode
    reqs: tuple[Req, ...] = ()
    ends: tuple[int, ...] = ()
    inputs: tuple[list[int], ...] = ()
    num_prefill: int = 0  # rows [0, num_prefill) are prompt chunks, the rest decode rows
    all_logits: bool = False  # prompt logprobs: the logits of every prefill position
    on_no_kv: OnNoKV = OnNoKV.RETRACT

    @property
    def prefill(self) -> tuple[Req, ...]:
        return self.reqs[: self.num_prefill]

    @property
    def prefill_ends(self) -> tuple[int, ...]:
        return self.ends[: self.num_prefill]

    @property
    def decode(self) -> tuple[Req, ...]:
        return self.reqs[self.num_prefill :]

    @property
    def decode_ends(self) -> tuple[int, ...]:
        return self.ends[self.num_prefill :]


IDLE = StepPlan(StepMode.IDLE, ForwardMode.DECODE)


def decode_rows(running: list[Req]) -> tuple[tuple[int, ...], tuple[list[int], ...], bool]:
    """Each running request's end (its seq_len) and tokens to forward: its last output, or
    after a jump-forward all its forced tokens. The bool: whether any jumped (an extend step)."""
    ends = tuple(r.seq_len for r in running)
    jumped = any(e - r.kv_len > 1 for r, e in zip(running, ends))
    if not jumped:
        return ends, tuple([r.output_ids[-1]] for r in running), False
    return ends, tuple(r.fill_ids()[r.kv_len :].tolist() for r in running), True


def decode_plan(running: list[Req]) -> StepPlan:
    """A decode step of every running request."""
    ends, inputs, jumped = decode_rows(running)
    return StepPlan(
        StepMode.DECODE,
        ForwardMode.EXTEND if jumped else ForwardMode.DECODE,
        tuple(running),
        ends,
        inputs,
    )


def prefill_plan(batch: list[tuple[Req, int]], running: list[Req], mixed: bool, all_logits: bool) -> StepPlan:
    """A prefill step of `batch` (request, end of its chunk); with `mixed`, the running
    requests decode in the same forward."""
    reqs = tuple(r for r, _ in batch)
    ends = tuple(e for _, e in batch)
    inputs = tuple(r.fill_ids()[r.kv_len : e].tolist() for r, e in batch)
    if not mixed:
        return StepPlan(
            StepMode.PREFILL,
            ForwardMode.EXTEND,
            reqs,
            ends,
            inputs,
            len(reqs),
            all_logits,
            OnNoKV.REQUEUE,
        )
    decode_ends, decode_inputs, _ = decode_rows(running)
    return StepPlan(
        StepMode.MIXED,
        ForwardMode.MIXED,
        reqs + tuple(running),
        ends + decode_ends,
        inputs + decode_inputs,
        len(reqs),
        False,
        OnNoKV.REQUEUE,
    )
