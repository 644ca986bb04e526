"""Speculative decoding (n-gram guesses, one verify forward): greedy output equals decoding
without it; sampled output follows the target distribution; rejected guesses leave no slot
behind."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from arbor import Engine
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.sampling.sampler import Sampler, SamplingBatch
from arbor.runtime.spec.proposer import NgramProposer, verify


def test_ngram_proposes_what_followed_the_latest_longest_match() -> None:
    p = NgramProposer(num_tokens=3, min_match=1, max_match=3)
    seq = np.array([5, 6, 7, 1, 2, 9, 5, 6, 7, 3, 4, 8, 5, 6, 7], dtype=np.int32)
    assert p.guess(seq, budget=10) == [3, 4, 8]  # "5 6 7" last seen before 3 4 8
    assert p.guess(seq, budget=2) == [3, 4]
    assert p.guess(np.array([1, 2, 3], dtype=np.int32), budget=5) == []
    # no 3-gram match: falls back to the 1-gram "9" -> what followed it
    assert NgramProposer(2, 1, 3).guess(np.array([9, 4, 4, 1, 2, 9], dtype=np.int32), budget=5) == [4, 4]
    assert NgramProposer(2, 2, 3).guess(np.array([9, 4, 4, 1, 2, 9], dtype=np.int32), budget=5) == []


def _batch(params: list[SamplingParams], vocab: int) -> SamplingBatch:
    return SamplingBatch.build(params, [0] * len(params), vocab, torch.device("cpu"))


def test_greedy_verify_keeps_the_agreeing_run_and_the_argmax_after_it() -> None:
    logits = torch.full((7, 10), -5.0)
    for row, tok in enumerate([3, 4, 5, 6, 1, 2, 8]):
        logits[row, tok] = 5.0
    drafts = [[3, 4, 9], [2, 8]]  # request 1: rows 0-3, request 2: rows 4-6
    verdicts = verify(logits, [0, 4], drafts, _batch([SamplingParams(temperature=0)] * 7, 10), Sampler(0, "cpu"))
    assert (verdicts[0].tokens, verdicts[0].accepted) == ([3, 4, 5], 2)  # 9 rejected: argmax 5 instead
    assert (verdicts[1].tokens, verdicts[1].accepted) == ([1], 0)
    assert verdicts[0].rows == [0, 1, 2]


def test_sampled_verify_follows_the_target_distribution() -> None:
    """A point-mass guess holds when it equals the target's own sample: the first two
    committed tokens follow p, whatever the guesses, and a guess d holds with probability p(d)
    (Leviathan et al.'s acceptance for a point-mass proposal). 20,000 samples over a 6-token vocabulary; the total-variation
    distance of each position's empirical distribution from p stays below 0.03 (its standard
    error here is about 0.008)."""
    vocab, n = 6, 20_000
    p1 = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])
    p2 = torch.tensor([0.3, 0.1, 0.1, 0.1, 0.2, 0.2])
    rows = torch.stack([p1.log(), p2.log(), p2.log()] * n)  # 3 rows a request: 2 guesses
    guesses = [[1, 0] if i % 2 else [5, 4] for i in range(n)]  # a likely and an unlikely guess
    params = [SamplingParams(temperature=1.0)] * (3 * n)
    verdicts = verify(rows, list(range(0, 3 * n, 3)), guesses, _batch(params, vocab), Sampler(7, "cpu"))
    first = torch.bincount(torch.tensor([v.tokens[0] for v in verdicts]), minlength=vocab) / n
    second = [v.tokens[1] for v in verdicts if len(v.tokens) > 1]
    second_freq = torch.bincount(torch.tensor(second), minlength=vocab) / len(second)
    assert 0.5 * (first - p1).abs().sum() < 0.03
    assert 0.5 * (second_freq - p2).abs().sum() < 0.03
    held = sum(v.accepted > 0 for v in verdicts[1::2]) / (n // 2)
    assert abs(held - float(p1[1])) < 0.02, "guess 1 holds with probability p1[1] = 0.4"
    held = sum(v.accepted > 0 for v in verdicts[0::2]) / (n // 2)
    assert abs(held - float(p1[5])) < 0.01, "guess 5 holds with probability p1[5] = 0.05"


REPEATED = [[random.Random(i).randrange(2000) for _ in range(12 + 5 * i)] * 3 for i in range(6)]


def _generate(path, prompts, params, **engine_args):
    with Engine(str(path), dtype="float32", **engine_args) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        stats = engine.stats()
    return outs, stats


@pytest.mark.parametrize(("algorithm", "page_size"), [("ngram", 1), ("ngram", 16), ("draft", 1), ("draft", 16)])
def test_greedy_outputs_equal_without_speculation(tiny_model, algorithm: str, page_size: int) -> None:
    """A mixed batch with cache hits (a shared prompt prefix), chunked prompts, stop ids, max
    tokens and logprobs: spec on == spec off, token for token, and no slot leaks. The draft
    (the target's own checkpoint, so guesses hold) prefills its shadows through its own tree."""
    prompts = [*REPEATED, REPEATED[0][:30] + [7, 8, 9] * 10, REPEATED[1] * 2]
    params = [
        {"max_new_tokens": 48 - 4 * i, "temperature": 0, "stop_token_ids": [11] if i == 2 else []}
        for i in range(len(prompts))
    ]
    common = {"page_size": page_size, "chunked_prefill_size": 64, "max_total_tokens": 4096}
    path = tiny_model("llama")
    base, _ = _generate(path, prompts, params, **common)
    extra = {"speculative_draft_model_path": str(path)} if algorithm == "draft" else {}
    spec, stats = _generate(path, prompts, params, speculative_algorithm=algorithm, **common, **extra)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in base]
    assert stats["spec_request_steps"] > 0 and stats["spec_accepted_tokens"] > 0, "guesses were made and held"
    assert stats["invariant_ok"] == 1.0
    assert any(o["meta_info"].get("spec_accept_len", 0) > 1 for o in spec)
    assert stats["spec_accept_length"] > 1


def test_greedy_equal_under_retraction_and_logprobs(tiny_model) -> None:
    """A pool too small for every request: retractions happen; committed tokens' logprobs
    equal those of plain decoding."""
    params = {"max_new_tokens": 64, "temperature": 0}
    common = {"max_total_tokens": 256, "page_size": 16}
    path = tiny_model("llama")
    with Engine(str(path), dtype="float32", **common) as e:
        base = e.generate(input_ids=REPEATED[:4], sampling_params=params, return_logprob=True)
    with Engine(str(path), dtype="float32", speculative_algorithm="ngram", **common) as e:
        spec = e.generate(input_ids=REPEATED[:4], sampling_params=params, return_logprob=True)
        stats = e.stats()
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in base]
    for a, b in zip(spec, base):
        ours = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
        want = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
        assert np.allclose(ours, want, atol=1e-4)
    assert stats["retractions"] > 0 and stats["spec_accepted_tokens"] > 0
    assert stats["invariant_ok"] == 1.0


@pytest.mark.parametrize("draft", ["same", "other", "same, token map"])
def test_draft_model_greedy_equal_and_no_leak(tiny_model, tmp_path, draft: str) -> None:
    """A draft checkpoint with its own KV and radix tree. The target itself as its draft:
    every guess holds; another checkpoint: most are rejected and rolled back in both pools.
    Outputs equal spec-off either way, with retractions in a small pool. With a token map
    (FR-Spec) holding the tokens the target picks, the draft's restricted head still agrees."""
    path = tiny_model("llama")
    draft_path = tiny_model("llama-tied-gqa4") if draft == "other" else path
    params = {"max_new_tokens": 40, "temperature": 0}
    prompts = REPEATED[:4]
    common = {"max_total_tokens": 256, "page_size": 16}
    base, _ = _generate(path, prompts, params, **common)
    extra = {}
    if draft.endswith("token map"):
        picked = sorted({t for o in base for t in o["output_ids"]})
        torch.save(torch.tensor([*picked, 1, 2, 3]), tmp_path / "map.pt")
        extra = {"speculative_token_map": str(tmp_path / "map.pt")}
    spec, stats = _generate(
        path,
        prompts,
        params,
        speculative_algorithm="draft",
        speculative_draft_model_path=str(draft_path),
        **common,
        **extra,
    )
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in base]
    assert stats["spec_request_steps"] > 0 and stats["invariant_ok"] == 1.0
    if draft != "other":
        assert stats["spec_accepted_tokens"] >= 0.9 * stats["spec_draft_tokens"]
        assert stats["spec_accept_length"] > 3


# A constrained mix: forced text (jump-forward), free digits, a choice, a JSON schema.
CONSTRAINED = [
    {"regex": r'\{"id": [0-9]{1,3}, "tags": \["(ab|cd|ef)"(, "(ab|cd|ef)"){8}\]\}'},
    {"regex": r"(yes|no)( (yes|no)){20}"},
    {"choices": ["alpha beta gamma", "alpha beta delta", "omega"]},
    {
        "json_schema": '{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"},'
        ' "maxItems": 6}, "b": {"enum": ["x", "y"]}}, "required": ["a", "b"]}'
    },
]
EDITED = [
    {"frequency_penalty": 0.1, "presence_penalty": 0.05},  # mild: the random model still repeats
    {"repetition_penalty": 1.05},
    {"stop": [" the", "\n\n"], "min_new_tokens": 4},
]


@pytest.mark.parametrize("algorithm", ["ngram", "draft", "draft, token map"])
def test_greedy_equal_with_grammar_penalties_and_stop_strings(tiny_model, tmp_path, algorithm: str) -> None:
    """Grammar-constrained requests (guesses cut to the grammar, per-guess masks, jump-forward
    mid-verification), penalised ones (each guess row penalised as if the guesses before it
    were output) and stop strings: spec on == spec off, and constrained rows did speculate.
    With a token map, constrained rows spread the draft's hot logits over the vocabulary
    before their masks; unconstrained rows pick from the hot columns."""
    path = tiny_model("llama")
    prompts = [
        "Return the record: " * 3,
        "yes no yes no yes no",
        "Pick one:",
        "JSON please " * 4,
        "repeat repeat repeat",
        "repeat repeat repeat",
        "the cat and the dog and the cat",
    ]
    params = [{**p, "temperature": 0, "max_new_tokens": 48} for p in CONSTRAINED + EDITED]
    common = {"max_total_tokens": 4096, "page_size": 16}
    with Engine(str(path), dtype="float32", **common) as e:
        base = e.generate(prompts, sampling_params=params)
    extra = {"speculative_draft_model_path": str(path)} if algorithm.startswith("draft") else {}
    if algorithm.endswith("token map"):  # the tokens the target picks: the draft's head keeps agreeing
        torch.save(torch.tensor(sorted({t for o in base for t in o["output_ids"]})), tmp_path / "map.pt")
        extra["speculative_token_map"] = str(tmp_path / "map.pt")
    with Engine(str(path), dtype="float32", speculative_algorithm=algorithm.split(",")[0], **common, **extra) as e:
        spec = e.generate(prompts, sampling_params=params)
        stats = e.stats()
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in base]
    assert [o["text"] for o in spec] == [o["text"] for o in base]
    verified = [o["meta_info"].get("spec_verify_ct", 0) for o in spec]
    assert sum(v > 0 for v in verified[: len(CONSTRAINED)]) >= 2, verified
    assert sum(v > 0 for v in verified[len(CONSTRAINED) :]) >= 2, verified
    assert stats["spec_accepted_tokens"] > 0 and stats["invariant_ok"] == 1.0


def test_n_samples_streaming_and_abort_with_speculation(tiny_model) -> None:
    """n > 1 seeded samples equal spec-off's (each committed token is the target's own seeded
    sample); a stream ends with the whole output; an abort mid-stream frees every
    slot of the target and the draft."""
    path = tiny_model("llama")
    sampled = {"temperature": 0.8, "seed": 5, "n": 3, "max_new_tokens": 32, "ignore_eos": True}
    with Engine(str(path), dtype="float32", max_total_tokens=2048, page_size=16) as e:
        plain = e.generate(input_ids=REPEATED[0], sampling_params=sampled)
    with Engine(
        str(path),
        dtype="float32",
        speculative_algorithm="draft",
        speculative_draft_model_path=str(path),
        max_total_tokens=2048,
        page_size=16,
    ) as e:
        first = e.generate(input_ids=REPEATED[0], sampling_params=sampled)
        again = e.generate(input_ids=REPEATED[0], sampling_params=sampled)  # cache hits: the same samples
        assert [o["output_ids"] for o in first] == [o["output_ids"] for o in plain]
        assert [o["output_ids"] for o in again] == [o["output_ids"] for o in plain]
        assert len({tuple(o["output_ids"]) for o in first}) == 3 and all(len(o["output_ids"]) == 32 for o in first)
        assert all(o["meta_info"].get("spec_verify_ct", 0) > 0 for o in first)

        greedy = {"temperature": 0, "max_new_tokens": 40}
        whole = e.generate(input_ids=REPEATED[1], sampling_params=greedy)
        chunks = list(e.generate(input_ids=REPEATED[1], sampling_params=greedy, stream=True))
        assert len(chunks) > 2 and chunks[-1]["output_ids"] == whole["output_ids"]
        assert chunks[-1]["text"] == whole["text"]
        assert chunks[-1]["meta_info"]["spec_verify_ct"] > 0

        stream = e.generate(
            input_ids=REPEATED[2],
            sampling_params={"temperature": 0, "max_new_tokens": 1000, "ignore_eos": True},
            stream=True,
        )
        next(stream)
        stream.close()  # the caller goes away: the request is aborted
        stats = e.stats()
        assert stats["running"] == 0 and stats["waiting"] == 0 and stats["invariant_ok"] == 1.0
