"""Constrained generation through the whole runtime with the tiny random checkpoints at
temperature 1.0: every output parses and validates, for both tokenizer families, and
jump-forward composes with chunked prefill, retraction, n > 1, streaming and the cache."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from arbor.runtime.engine import Engine
from arbor.runtime.io.tokenizer_manager import RequestRefused
from arbor.runtime.tiny_model import TinySpec, make_tiny_model
from tests.grammar.conftest import LLAMA2
from tests.grammar.schemas import CHOICES, REGEXES, SCHEMAS

SEEDS = range(10)
MAX_TOKENS = 1500


@pytest.fixture(scope="module", params=["gpt2", "llama2"])
def engine(request, tiny_model, tiny_root):
    if request.param == "gpt2":
        path = tiny_model("llama")
    else:
        if not (LLAMA2 / "tokenizer.model").exists():
            pytest.skip("the Llama-2 tokenizer is not beside this checkout (../shared/data)")
        path = tiny_root / "llama-sentencepiece"
        if not (path / "config.json").exists():
            make_tiny_model(path, TinySpec(seed=7, sentencepiece_model=str(LLAMA2 / "tokenizer.model")))
    # Wall-clock guards loosened: this test checks the outputs, and a shared machine can stall the
    # scheduler past 50 ms in one step (the mask guard has its own tests).
    with Engine(
        str(path),
        max_running_requests=128,
        max_total_tokens=120_000,
        grammar_compile_timeout_s=60,
        grammar_max_mask_ms=1000,
    ) as e:
        yield e


def _sampled(constraint: dict, seed: int) -> dict:
    return {**constraint, "temperature": 1.0, "seed": seed, "max_new_tokens": MAX_TOKENS}


def test_every_schema_output_validates(engine) -> None:
    names = sorted(SCHEMAS)  # unbounded strings too: budget-aware decoding closes them in time
    assert len(names) >= 30
    params = [_sampled({"json_schema": SCHEMAS[n]}, s) for n in names for s in SEEDS]
    outs = engine.generate(["Give me JSON:"] * len(params), sampling_params=params)
    for i, out in enumerate(outs):
        name = names[i // len(SEEDS)]
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (name, out["text"][:200])
        jsonschema.validate(json.loads(out["text"]), SCHEMAS[name])


def test_regex_and_choices_outputs_match(engine) -> None:
    cases = [({"regex": r}, lambda t, r=r: re.fullmatch(r, t)) for r in REGEXES]
    cases += [({"choices": c}, lambda t, c=c: t in c) for c in CHOICES]
    params = [_sampled(c, s) for c, _ in cases for s in SEEDS]
    outs = engine.generate(["Answer:"] * len(params), sampling_params=params)
    for i, out in enumerate(outs):
        constraint, ok = cases[i // len(SEEDS)]
        assert ok(out["text"]), (constraint, out["text"])


def test_unconstrained_requests_beside_constrained_ones_are_untouched(engine) -> None:
    # Only the constrained rows of a batch are masked: a free request in the same batch samples
    # exactly what it generates alone (greedy).
    free = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    alone = engine.generate("Free text:", sampling_params=free)["output_ids"]
    mixed = engine.generate(
        ["JSON:", "Free text:", "Digits:"],
        sampling_params=[
            _sampled({"json_schema": SCHEMAS[sorted(SCHEMAS)[0]]}, 1),
            free,
            _sampled({"regex": "[0-9]{3,9}"}, 2),
        ],
    )
    assert mixed[1]["output_ids"] == alone
    assert re.fullmatch("[0-9]{3,9}", mixed[2]["text"])


def test_max_tokens_cutting_a_structure_finishes_with_length(engine) -> None:
    """Without budget awareness the budget cuts the structure; with it (JSON's default) a
    budget below the schema's minimum is refused up front."""
    params = _sampled({"json_schema": SCHEMAS["nested"]}, 0) | {"max_new_tokens": 5}
    out = engine.generate("x", sampling_params=params | {"budget_aware": False})
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert out["meta_info"]["completion_tokens"] == 5
    with pytest.raises(RequestRefused, match="needs at the least"):
        engine.generate("x", sampling_params=params)


def test_jump_forward_composes_with_chunking_retraction_n_and_streaming(tiny_model) -> None:
    # A long fixed-length array: "," is forced after every digit, and 18 outputs of ~120
    # tokens overflow the small pool, so requests are retracted and recomputed mid-array.
    schema = {
        "type": "object",
        "properties": {
            "digits": {
                "type": "array",
                "minItems": 60,
                "maxItems": 60,
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
            }
        },
        "required": ["digits"],
    }
    long_prompt = "word " * 300
    with Engine(str(tiny_model("llama")), chunked_prefill_size=64, max_total_tokens=2400, max_running_requests=32) as e:
        params = {"json_schema": schema, "temperature": 1.0, "max_new_tokens": 140, "n": 3}
        outs = e.generate(
            [f"{i} {long_prompt}" for i in range(6)], sampling_params=[params | {"seed": i} for i in range(6)]
        )
        assert len(outs) == 18
        for out in outs:
            jsonschema.validate(json.loads(out["text"]), schema)
        streamed = list(e.generate("0 " + long_prompt, sampling_params=params | {"seed": 0, "n": 1}, stream=True))
        final = e.generate("0 " + long_prompt, sampling_params=params | {"seed": 0, "n": 1})
        assert streamed[-1]["text"] == final["text"]
        assert final["meta_info"]["cached_tokens"] > 300  # the radix cache still serves the prompt
        stats = e.stats()
        assert stats["forced_tokens"] > 0
        assert stats["retractions"] > 0, "the small pool should have forced a retraction"
        assert stats["invariant_ok"] == 1.0


def test_invalid_constraint_is_refused_before_it_is_queued(engine) -> None:
    with pytest.raises(ValueError, match="unknown type"):
        engine.generate("x", sampling_params={"json_schema": {"type": "wat"}})
    assert engine.generate("x", sampling_params={"max_new_tokens": 2})["meta_info"]["completion_tokens"] == 2
