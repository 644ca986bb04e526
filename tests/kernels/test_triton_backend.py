"""The model forward with the triton backend (attention kernels + fused norm, SiLU, RoPE,
KV store) equals the torch backend on a tiny checkpoint: prefill, extend after a cached
prefix, and decode steps, fp32."""

from __future__ import annotations

import pytest
import torch

from arbor.kernels.norm import rmsnorm_triton
from arbor.runtime.config import ServerArgs
from arbor.runtime.memory import reserve_positions
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.runner import ModelRunner

ATOL = 1e-4


def _step(runner: ModelRunner, mode: ForwardMode, new: list[list[int]], starts: list[int], rows: list[int]):
    loc = reserve_positions(runner.req_to_token, runner.allocator, rows, starts,
                            [s + len(n) for s, n in zip(starts, new)])
    batch = ForwardBatch.build(mode, new, starts, rows, loc, runner.req_to_token.table)
    return runner.forward(batch).next_token_logits


@pytest.mark.parametrize(("name", "page_size"), [("llama", 1), ("llama-tied-gqa4", 16)])
def test_triton_backend_equals_torch_backend(tiny_model, name, page_size) -> None:
    path = str(tiny_model(name))
    runners = [ModelRunner(ServerArgs(dtype="float32", max_total_tokens=1024, page_size=page_size,
                                      attention_backend=b), path) for b in ("torch", "triton")]
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
