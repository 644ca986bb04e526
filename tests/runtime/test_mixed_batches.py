"""Mixed batches (--enable-mixed-chunk): prompts that arrive while others decode, long prompts
split into chunks: greedy decoding gives the same tokens as with separate prefill and decode
steps (fp32), in fewer forward passes."""

from __future__ import annotations

import random

import pytest

from arbor.runtime.config import ServerArgs
from arbor.runtime.io.messages import TokenizedGenerateReq, pack_ids, unpack_ids
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.scheduler.scheduler import Scheduler


def _serve(model: str, mixed: bool, page_size: int) -> tuple[dict[str, list[int]], list[str]]:
    """Staggered arrivals (one new request every other step); tokens per rid and the modes."""
    args = ServerArgs.from_flags(
        device="cpu",
        attention_backend="torch",
        dtype="float32",
        enable_mixed_chunk=mixed,
        chunked_prefill_size=48,
        page_size=page_size,
    )
    sched = Scheduler(args, model)
    modes: list[str] = []
    forward = sched.runner.forward

    def recorded(batch):
        modes.append(batch.mode.value)
        return forward(batch)

    sched.runner.forward = recorded
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 500) for _ in range(rng.choice([5, 20, 130]))] for _ in range(8)]
    tokens: dict[str, list[int]] = {}
    step = 0
    while prompts or sched.has_work:
        if prompts and step % 2 == 0:
            ids = prompts.pop()
            sched.add(
                TokenizedGenerateReq(
                    rid=f"r{len(prompts)}",
                    input_ids=pack_ids(ids),
                    sampling=SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True),
                )
            )
        for out in sched.step():
            tokens.setdefault(out.rid, []).extend(unpack_ids(out.new_ids).tolist())
        step += 1
        assert step < 500
    assert sched.check_invariant() is None
    return tokens, modes


@pytest.mark.parametrize("page_size", [1, 16])
def test_mixed_steps_give_the_same_tokens(tiny_model, page_size: int) -> None:
    model = str(tiny_model("llama"))
    mixed, modes = _serve(model, True, page_size)
    plain, plain_modes = _serve(model, False, page_size)
    assert mixed == plain and all(len(t) == 12 for t in mixed.values())
    assert "mixed" in modes and "mixed" not in plain_modes
    assert len(modes) < len(plain_modes), "prefills no longer take steps of their own"
