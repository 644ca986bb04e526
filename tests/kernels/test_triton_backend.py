"""The model forward with the triton backend (attention kernels + fused norm, SiLU, RoPE,
KV store) equals the torch backend on a tiny checkpoint: prefill, extend after a cached
prefix, and decode steps, fp32."""

from __future__ import annotations

import pytest
import torch

from arbor.kernels.norm import rmsnorm_triton
from arbor.runtime.config import CacheArgs, ModelArgs, ServerArgs
from arbor.runtime.kv.pool import reserve_positions
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.runner import ModelRunner

ATOL = 1e-4


def _step(runner: ModelRunner, mode: ForwardMode, new: list[list[int]], starts: list[int], rows: list[int]):
    loc = reserve_positions(
        runner.req_to_token, runner.allocator, rows, starts, [s + len(n) for s, n in zip(starts, new)]
    )
    batch = ForwardBatch.build(mode, new, starts, rows, loc, runner.req_to_token.table)
    return runner.forward(batch).next_token_logits


@pytest.mark.parametrize(
    ("name", "page_size", "kv"),
    [("llama", 1, "auto"), ("llama-tied-gqa4", 16, "auto"), ("llama-tied-gqa4", 16, "fp8_e4m3")],
)
def test_triton_backend_equals_torch_backend(tiny_model, name, page_size, kv) -> None:
    """fp8_e4m3: both backends attend to the float8 pool's values (read in the Triton kernels
    as float8 and widened there)."""
    path = str(tiny_model(name))
    cache = CacheArgs(max_total_tokens=1024, page_size=page_size, dtype=kv)
    runners = [
        ModelRunner(ModelArgs(dtype="float32", attention_backend=b), cache, 64, path) for b in ("torch", "triton")
    ]
    assert runners[1].model.norm.kernel is rmsnorm_triton  # the fused ops are in use
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50000, (n,), generator=gen).tolist() for n in (5, 21, 2)]
    outs = []
    for r in runners:
        rows = [r.req_to_token.alloc() for _ in prompts]
        seqs = [list(p) for p in prompts]
        # Prefill the first 16 tokens of the second prompt, then extend all three.
        _step(r, ForwardMode.EXTEND, [seqs[1][:16]], [0], [rows[1]])
        logits = [_step(r, ForwardMode.EXTEND, [seqs[0], seqs[1][16:], seqs[2]], [0, 16, 0], rows)]
        for _ in range(3):
            nxt = logits[-1].argmax(-1).tolist()
            starts = [len(s) for s in seqs]
            for s, t in zip(seqs, nxt):
                s.append(t)
            logits.append(_step(r, ForwardMode.DECODE, [[t] for t in nxt], starts, rows))
        outs.append((logits, seqs))
    (ref, ref_seqs), (ours, our_seqs) = outs
    assert our_seqs == ref_seqs
    for a, b in zip(ref, ours):
        assert (a - b).abs().max().item() < ATOL and a.abs().max() > 0.5


def test_speculative_verify_through_the_triton_backend(tiny_model) -> None:
    """The verify step is an extend with every position's logits: under the triton backend
    (its extend kernel, in Triton's interpreter here) greedy n-gram speculation gives the
    tokens plain decoding gives."""
    from arbor.runtime.io.messages import TokenizedGenerateReq, pack_ids, unpack_ids
    from arbor.runtime.sampling.params import SamplingParams
    from arbor.runtime.scheduler.scheduler import Scheduler

    path = str(tiny_model("llama"))
    prompts = [[5, 6, 7, 8] * 4, [9, 10, 11] * 5]
    results = []
    for spec in (None, "ngram"):
        args = ServerArgs.from_flags(
            dtype="float32", max_total_tokens=1024, attention_backend="triton", speculative_algorithm=spec
        )
        sched = Scheduler(args, path)
        for i, p in enumerate(prompts):
            sched.add(
                TokenizedGenerateReq(
                    rid=str(i), input_ids=pack_ids(p), sampling=SamplingParams(max_new_tokens=12, temperature=0)
                )
            )
        out: dict[str, list[int]] = {"0": [], "1": []}
        while sched.has_work:
            for o in sched.step():
                out[o.rid] += unpack_ids(o.new_ids)
        results.append((out, sched.stats.as_floats()))
        sched.close()
    (plain, _), (spec_out, counters) = results
    assert spec_out == plain and all(len(v) == 12 for v in plain.values())
    assert counters["spec_request_steps"] > 0
