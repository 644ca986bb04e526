"""Our forward pass equals Hugging Face transformers' reference model on the same checkpoint."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from arbor.runtime.config import CacheArgs, ModelArgs
from arbor.runtime.engine import Engine
from arbor.runtime.kv.pool import reserve_positions
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.runner import ModelRunner

ATOL = 1e-4


def _hf(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 50257, (n,), generator=g).tolist() for n in lengths]


def _extend(runner, prompts, prefix_lens, rows, all_logits=True):
    new = [p[k:] for p, k in zip(prompts, prefix_lens)]
    ends = [len(p) for p in prompts]
    loc = reserve_positions(runner.req_to_token, runner.allocator, rows, list(prefix_lens), ends)
    batch = ForwardBatch.build(
        ForwardMode.EXTEND, new, list(prefix_lens), rows, loc, runner.req_to_token.table, return_all_logits=all_logits
    )
    return runner.forward(batch)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral", "llama-tied-gqa4", "llama3-rope"])
def test_prefill_logits_match_transformers(tiny_model, name):
    path = tiny_model(name)
    runner = ModelRunner(ModelArgs(dtype="float32"), CacheArgs(max_total_tokens=4096), 64, str(path))
    hf = _hf(path)
    prompts = _prompts([1, 7, 33, 130])  # 130 > original context 64 of the llama3-rope model
    rows = [runner.req_to_token.alloc() for _ in prompts]
    out = _extend(runner, prompts, [0] * len(prompts), rows)
    offset = 0
    with torch.no_grad():
        for p in prompts:
            ref = hf(torch.tensor([p])).logits[0]
            ours = out.all_logits[offset : offset + len(p)]
            offset += len(p)
            assert (ref - ours).abs().max().item() < ATOL
            assert ref.abs().max() > 0.5  # the comparison is not between near-zero logits


@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_from_cached_prefix_equals_full_prefill(tiny_model, page_size):
    path = tiny_model("llama")
    runner = ModelRunner(
        ModelArgs(dtype="float32"), CacheArgs(max_total_tokens=4096, page_size=page_size), 64, str(path)
    )
    prompts = _prompts([40, 37], seed=1)
    full = _extend(runner, prompts, [0, 0], [runner.req_to_token.alloc() for _ in prompts])
    # Second copy: prefill a page-aligned prefix first, then extend the rest from the pool.
    rows = [runner.req_to_token.alloc() for _ in prompts]
    prefix = [16, 32]
    _extend(runner, [p[:k] for p, k in zip(prompts, prefix)], [0, 0], rows)
    rest = _extend(runner, prompts, prefix, rows)
    offset_full = [0, 40]
    offset_rest = [0, 40 - 16]
    for i, (p, k) in enumerate(zip(prompts, prefix)):
        a = full.all_logits[offset_full[i] + k : offset_full[i] + len(p)]
        b = rest.all_logits[offset_rest[i] : offset_rest[i] + len(p) - k]
        assert (a - b).abs().max().item() < ATOL


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_across_page_boundaries_matches_transformers(tiny_model, page_size):
    path = tiny_model("qwen2")
    runner = ModelRunner(
        ModelArgs(dtype="float32"), CacheArgs(max_total_tokens=4096, page_size=page_size), 64, str(path)
    )
    hf = _hf(path)
    prompts = _prompts([13, 16, 3], seed=2)
    rows = [runner.req_to_token.alloc() for _ in prompts]
    seqs = [list(p) for p in prompts]
    out = _extend(runner, seqs, [0] * 3, rows, all_logits=False)
    for _ in range(20):  # crosses the 16-slot page boundary for every request
        nxt = out.next_token_logits.argmax(-1).tolist()
        starts = [len(s) for s in seqs]
        for s, t in zip(seqs, nxt):
            s.append(t)
        loc = reserve_positions(runner.req_to_token, runner.allocator, rows, starts, [n + 1 for n in starts])
        batch = ForwardBatch.build(
            ForwardMode.DECODE, [[s[-1]] for s in seqs], starts, rows, loc, runner.req_to_token.table
        )
        out = runner.forward(batch)
    with torch.no_grad():
        for i, s in enumerate(seqs):
            ref = hf(torch.tensor([s])).logits[0, -1]
            assert (ref - out.next_token_logits[i]).abs().max().item() < ATOL


def test_batched_greedy_equals_transformers_generate(tiny_model):
    path = tiny_model("llama")
    hf = _hf(path)
    prompts = _prompts([3, 11, 25, 60, 8], seed=3)
    with Engine(str(path), dtype="float32") as engine:
        outs = engine.generate(
            input_ids=prompts, sampling_params={"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
        )
    for p, out in zip(prompts, outs):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=32, min_new_tokens=32, do_sample=False)
        assert out["output_ids"] == ref[0, len(p) :].tolist()
        assert out["meta_info"]["completion_tokens"] == 32
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 32}
