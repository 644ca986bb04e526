"""The float8 KV cache (`--kv-cache-dtype fp8_e4m3`): twice the tokens in the same memory,
attention over the stored values on the CPU kernel and torch paths, and output close to the
unquantized cache's."""

from __future__ import annotations

import pytest
import torch

from arbor import Engine
from arbor.runtime.config import CacheArgs, ModelArgs
from arbor.runtime.kv.pool import as_stored, to_kv_dtype
from arbor.runtime.model import runner as runner_module
from arbor.runtime.model.runner import ModelRunner

PROMPT = [(i * 7919) % 50000 for i in range(48)]
SUFFIXES = [[(i * 104729 + j) % 50000 for i in range(24)] for j in range(3)]


def test_float8_saturates_instead_of_overflowing() -> None:
    x = torch.tensor([1.0, -1000.0, 3000.0, 0.01])
    stored = to_kv_dtype(x, torch.float8_e4m3fn)
    assert stored.float().tolist()[:3] == [1.0, -448.0, 448.0]
    k, _ = as_stored(x, x, torch.float8_e4m3fn)
    assert k.dtype == x.dtype and torch.isfinite(k).all()
    assert as_stored(x, x, torch.bfloat16)[0] is x


def test_fp8_cache_holds_twice_the_tokens(tiny_model, monkeypatch) -> None:
    """The same memory budget: float8 slots are half the bytes of bf16 ones."""
    monkeypatch.setattr(runner_module, "_free_memory_bytes", lambda device: 64 * 2**20)
    path = str(tiny_model("llama"))
    sizes = {
        kv: ModelRunner(ModelArgs(dtype="bfloat16"), CacheArgs(dtype=kv), 512, path) for kv in ("auto", "fp8_e4m3")
    }
    bf16, fp8 = sizes["auto"], sizes["fp8_e4m3"]
    assert fp8.kv_pool.k[0].dtype == torch.float8_e4m3fn
    assert abs(fp8.allocator.total_slots - 2 * bf16.allocator.total_slots) <= 2
    assert abs(fp8.kv_pool.nbytes() - bf16.kv_pool.nbytes()) <= 0.01 * bf16.kv_pool.nbytes()


def _suffix_logprobs(path: str, kv: str, page_size: int) -> tuple[list[list[float]], list[list[int]], dict]:
    """Logprobs of each suffix's tokens after a cached prompt (read back from the pool), and
    24 greedy tokens after each."""
    with Engine(path, dtype="float32", kv_cache_dtype=kv, page_size=page_size, max_total_tokens=4096) as engine:
        engine.generate(input_ids=PROMPT, sampling_params={"max_new_tokens": 0})  # cache the prompt
        outs = engine.generate(
            input_ids=[PROMPT + s for s in SUFFIXES],
            return_logprob=True,
            logprob_start_len=len(PROMPT),
            sampling_params={"max_new_tokens": 24, "temperature": 0},
        )
        stats = engine.stats()
    lps = [[e[0] for e in o["meta_info"]["input_token_logprobs"][1:]] for o in outs]
    return lps, [o["output_ids"] for o in outs], stats


@pytest.mark.parametrize("page_size", [1, 16])
def test_fp8_cache_stays_close_to_the_float_cache(tiny_model, page_size: int) -> None:
    """Teacher-forced logprobs after a cached prefix differ by at most 0.05 nats a token
    (e4m3 keeps 3 mantissa bits: about 3% per value). Greedy output is the same run to run;
    the random model's near-tied logits make it diverge from the float cache's, so closeness
    of generations is measured on the trained eval model instead (bench_quant's perplexity)."""
    path = str(tiny_model("llama"))
    ref, _, _ = _suffix_logprobs(path, "auto", page_size)
    got, out, stats = _suffix_logprobs(path, "fp8_e4m3", page_size)
    assert stats["cache_hit_rate"] > 0 and stats["invariant_ok"] == 1.0
    diffs = [abs(a - b) for r, g in zip(ref, got) for a, b in zip(r, g)]
    assert max(diffs) < 0.05 and sum(diffs) > 0  # close, and the cache really was float8
    assert _suffix_logprobs(path, "fp8_e4m3", page_size)[1] == out
