"""The Engine over real scheduler and detokenizer processes: continuous batching, radix
reuse, chunked prefill, retraction under KV pressure, abort, stop conditions, n > 1."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from arbor.runtime.engine import Engine
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.sampling.penalties import apply_penalties


def greedy(max_new: int, **extra) -> dict:
    return {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True, **extra}


def mixed_workload(seed: int, count: int, max_prompt: int, max_out: int) -> tuple[list[list[int]], list[dict]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(50000) for _ in range(rng.randint(1, max_prompt))] for _ in range(count)]
    params = [greedy(rng.randint(1, max_out)) for _ in range(count)]
    return prompts, params


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(str(tiny_model("llama")), dtype="float32") as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The single-request path: one request at a time, no cache."""
    with Engine(str(tiny_model("llama")), dtype="float32", max_running_requests=1, disable_radix_cache=True) as e:
        yield e


def assert_idle_and_consistent(e: Engine) -> dict:
    stats = e.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0
    assert stats["invariant_ok"] == 1.0
    return stats


def test_64_concurrent_requests_equal_single_request_greedy(engine, reference):
    prompts, params = mixed_workload(1, 64, 300, 40)
    batched = engine.generate(input_ids=prompts, sampling_params=params)
    single = [reference.generate(input_ids=p, sampling_params=q) for p, q in zip(prompts, params)]
    for b, s, q in zip(batched, single, params):
        assert b["output_ids"] == s["output_ids"]
        assert b["meta_info"]["finish_reason"] == {"type": "length", "length": q["max_new_tokens"]}
        assert b["text"] == engine.tokenizer.decode(b["output_ids"])
    assert engine.stats()["decode_steps"] < sum(q["max_new_tokens"] for q in params) / 4  # really batched
    assert_idle_and_consistent(engine)


def test_resent_prompts_hit_the_cache(engine):
    prompts, _ = mixed_workload(2, 8, 120, 1)
    first = engine.generate(input_ids=prompts, sampling_params=greedy(4))
    again = engine.generate(input_ids=prompts, sampling_params=greedy(4))
    for p, a, b in zip(prompts, first, again):
        assert a["meta_info"]["prompt_tokens"] == len(p)
        assert b["meta_info"]["cached_tokens"] == len(p) - 1
        assert a["output_ids"] == b["output_ids"]


def test_five_turn_chat_reuses_prompt_and_generated_tokens(engine):
    history = engine.tokenizer.encode("<|system|>\nYou are terse.<|endoftext|>\n")
    previous = 0
    for turn in range(5):
        history += engine.tokenizer.encode(f"<|user|>\nQuestion {turn}?<|endoftext|>\n<|assistant|>\n")
        out = engine.generate(input_ids=history, sampling_params=greedy(12))
        if turn:
            assert out["meta_info"]["cached_tokens"] >= previous - 1  # all of the last turn, but its final token
        history += out["output_ids"]
        previous = len(history)


def test_text_prompts_batch_and_stream_like_the_batch(engine):
    outs = engine.generate(["The radix tree", "Hello"], sampling_params=greedy(10))
    chunks = list(engine.generate("The radix tree", sampling_params=greedy(10), stream=True))
    assert chunks[-1]["text"] == outs[0]["text"] and chunks[-1]["output_ids"] == outs[0]["output_ids"]
    assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert all(chunks[i]["text"].startswith(chunks[i - 1]["text"]) for i in range(1, len(chunks)))


def test_async_generate_from_another_event_loop(engine):
    import asyncio

    async def main():
        one = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=greedy(6))
        stream = await engine.async_generate(input_ids=[5, 6, 7], sampling_params=greedy(6), stream=True)
        last = [c async for c in stream][-1]
        return one, last

    one, last = asyncio.run(main())
    assert one["output_ids"] == last["output_ids"] and len(one["output_ids"]) == 6


def test_n_samples_share_one_prefill_and_differ(engine):
    prompt = list(range(1000, 1200))
    outs = engine.generate(
        input_ids=prompt,
        sampling_params={"max_new_tokens": 8, "n": 4, "temperature": 1.0, "seed": 3, "ignore_eos": True},
    )
    assert len(outs) == 4 and [o["index"] for o in outs] == [0, 1, 2, 3]
    assert sorted(o["meta_info"]["cached_tokens"] for o in outs) == [0, 199, 199, 199]
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    again = engine.generate(
        input_ids=prompt,
        sampling_params={"max_new_tokens": 8, "n": 4, "temperature": 1.0, "seed": 3, "ignore_eos": True},
    )
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in outs]  # seeds reproduce


def test_stop_string_trims_the_text_and_ends_the_request(engine):
    base = engine.generate("Once upon a time", sampling_params=greedy(24))
    text = base["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    out = engine.generate("Once upon a time", sampling_params=greedy(24, stop=[stop]))
    assert out["text"] == text[: text.find(stop)]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert_idle_and_consistent(engine)


def test_stop_token_ids_and_min_new_tokens(engine):
    base = engine.generate(input_ids=[11, 12, 13], sampling_params=greedy(10))["output_ids"]
    stop_tok = base[2]
    early = engine.generate(
        input_ids=[11, 12, 13], sampling_params={"max_new_tokens": 10, "temperature": 0, "stop_token_ids": [stop_tok]}
    )
    assert early["output_ids"] == base[:3] and early["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": stop_tok,
    }
    held = engine.generate(
        input_ids=[11, 12, 13],
        sampling_params={"max_new_tokens": 10, "temperature": 0, "stop_token_ids": [stop_tok], "min_new_tokens": 6},
    )
    assert len(held["output_ids"]) >= 6 and stop_tok not in held["output_ids"][:6]


def test_penalties_follow_their_formulas():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0)
    apply_penalties(logits, [p], [[0, 0, 1]])
    # token 0: 2 - 2*0.5 - 0.25 = 0.75 -> /2; token 1: -1 - 0.5 - 0.25 = -1.75 -> *2; others untouched
    assert torch.allclose(logits, torch.tensor([[0.375, -3.5, 0.5, 3.0]]))


def test_presence_penalty_changes_a_repetitive_greedy_output(engine):
    plain = engine.generate(input_ids=[7, 8, 9], sampling_params=greedy(32))["output_ids"]
    penalized = engine.generate(input_ids=[7, 8, 9], sampling_params=greedy(32, presence_penalty=2.0))["output_ids"]
    assert len(set(penalized)) > len(set(plain))


def test_abort_frees_kv_at_once(engine):
    before = engine.stats()
    stream = engine.generate(input_ids=list(range(300, 400)), sampling_params=greedy(1500), stream=True)
    first = next(stream)
    assert first["meta_info"]["finish_reason"] is None
    stream.close()  # the caller goes away: the request is aborted
    after = assert_idle_and_consistent(engine)
    assert after["decode_steps"] - before["decode_steps"] < 200

    results = []
    worker = threading.Thread(
        target=lambda: results.append(
            engine.generate(input_ids=list(range(500, 520)), sampling_params=greedy(1500), rid="to-abort")
        )
    )
    worker.start()
    time.sleep(1.0)
    engine.abort("to-abort")
    worker.join(30)
    assert results[0]["meta_info"]["finish_reason"] == {"type": "abort", "message": "aborted", "status_code": 499}
    assert len(results[0]["output_ids"]) < 1500
    assert_idle_and_consistent(engine)


def test_bad_requests_get_clear_errors_and_the_engine_keeps_serving(engine):
    cases = [
        ({"input_ids": []}, "the prompt is empty"),
        ({"input_ids": [1, 2, 99999999]}, "outside the vocabulary"),
        ({"input_ids": [1] * 5000}, "context length is 2048"),
        ({"input_ids": [1], "sampling_params": {"n": 0}}, "n must be"),
        ({"input_ids": [1], "sampling_params": {"stop": [""]}}, "stop must be"),
        ({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature"),
        ({"prompt": "a", "input_ids": [1]}, "exactly one"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.generate(**kwargs)
    assert len(engine.generate(input_ids=[1, 2], sampling_params=greedy(3))["output_ids"]) == 3


def test_quarter_sized_kv_pool_retracts_and_matches_roomy_pool(tiny_model, engine):
    prompts, _ = mixed_workload(4, 32, 100, 1)
    params = greedy(64)
    need = sum(len(p) + 64 for p in prompts)
    roomy = engine.generate(input_ids=prompts, sampling_params=params)
    with Engine(str(tiny_model("llama")), dtype="float32", max_total_tokens=need // 4, page_size=16) as tight:
        outs = tight.generate(input_ids=prompts, sampling_params=params)
        stats = assert_idle_and_consistent(tight)
    assert stats["retractions"] > 0
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in roomy]
    assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)


def test_chunked_prefill_of_3000_tokens_equals_unchunked(tiny_model):
    path = str(tiny_model("llama-long"))
    prompt = [random.Random(5).randrange(50000) for _ in range(3000)]
    params = greedy(16)
    with Engine(path, dtype="float32", chunked_prefill_size=512) as chunked:
        a = chunked.generate(input_ids=prompt, sampling_params=params, return_logprob=True)
        steps = chunked.stats()["prefill_steps"]
    with Engine(path, dtype="float32", chunked_prefill_size=0, max_prefill_tokens=4096) as whole:
        b = whole.generate(input_ids=prompt, sampling_params=params, return_logprob=True)
        whole_steps = whole.stats()["prefill_steps"]
    assert steps == 6 and whole_steps == 1
    assert a["output_ids"] == b["output_ids"]
    la = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
    lb = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
    assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-4


def test_prompt_logprobs_match_transformers_and_survive_cache_hits(engine, tiny_model):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model("llama"), dtype=torch.float32).eval()
    prompt = [random.Random(9).randrange(50000) for _ in range(40)]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], -1)
    expected = [ref[p - 1, prompt[p]].item() for p in range(1, len(prompt))]
    for start in (0, 25, 25):  # the third call finds the prompt cached, yet must compute from 24 on
        out = engine.generate(
            input_ids=prompt,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=start,
            top_logprobs_num=3,
            return_text_in_logprobs=True,
        )
        meta = out["meta_info"]
        assert out["output_ids"] == [] and meta["finish_reason"] == {"type": "length", "length": 0}
        entries = meta["input_token_logprobs"]
        assert len(entries) == len(prompt) - start and [e[1] for e in entries] == prompt[start:]
        if start == 0:
            assert entries[0][0] is None and meta["input_top_logprobs"][0] is None
            entries, tops = entries[1:], meta["input_top_logprobs"][1:]
        else:
            tops = meta["input_top_logprobs"]
        assert max(abs(e[0] - x) for e, x in zip(entries, expected[max(start, 1) - 1 :])) < 1e-4
        assert entries[0][2] == engine.tokenizer.decode([entries[0][1]])
        best = ref[max(start, 1) - 1].topk(3)
        assert [t[1] for t in tops[0]] == best.indices.tolist()
    assert meta["cached_tokens"] == 24
    gen = engine.generate(input_ids=prompt, sampling_params=greedy(4), return_logprob=True, top_logprobs_num=2)
    lps = gen["meta_info"]["output_token_logprobs"]
    assert len(lps) == 4 and all(len(row) == 2 for row in gen["meta_info"]["output_top_logprobs"])
    assert all(row[0][1] == tok for row, tok in zip(gen["meta_info"]["output_top_logprobs"], gen["output_ids"]))
