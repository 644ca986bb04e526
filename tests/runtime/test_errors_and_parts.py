"""Clear errors for bad checkpoints and prompts; memory, sampler and checkpoint-writer behaviour."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arbor.runtime.engine import Engine
from arbor.runtime.kv.pool import PageAllocator, ReqToTokenPool, reserve_positions
from arbor.runtime.model.model_config import CheckpointError, ModelConfig
from arbor.runtime.sampling.params import SamplingParams
from arbor.runtime.sampling.sampler import Sampler, SamplingBatch
from arbor.runtime.tiny_model import TinySpec, make_tiny_model


def test_missing_directory_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        ModelConfig.from_dir(tmp_path / "nope")


def test_malformed_config_is_one_line_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        ModelConfig.from_dir(tmp_path)


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel"):
        ModelConfig.from_dir(tmp_path)


def test_cli_reports_bad_checkpoint_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "arbor", "demo", "--model-path", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no config.json" in proc.stderr


def test_legacy_rope_scaling_form_is_read(tiny_model, tmp_path):
    src = tiny_model("llama3-rope")
    raw = json.loads((src / "config.json").read_text())
    params = raw.pop("rope_parameters")
    raw["rope_theta"] = params.pop("rope_theta")
    raw["rope_scaling"] = params
    (tmp_path / "config.json").write_text(json.dumps(raw))
    a, b = ModelConfig.from_dir(src), ModelConfig.from_dir(tmp_path)
    assert (a.rope_theta, a.rope_scaling) == (b.rope_theta, b.rope_scaling)
    assert b.rope_scaling["rope_type"] == "llama3"


def test_sharded_checkpoint_loads_like_single_file(tiny_model, tmp_path):
    sharded = make_tiny_model(tmp_path / "sharded", TinySpec(arch="llama"), max_shard_bytes=2_000_000)
    assert (sharded / "model.safetensors.index.json").exists()
    ids = [[5, 6, 7, 8]]
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with Engine(str(sharded), dtype="float32") as e1, Engine(str(tiny_model("llama")), dtype="float32") as e2:
        a = e1.generate(input_ids=ids, sampling_params=params)[0]
        b = e2.generate(input_ids=ids, sampling_params=params)[0]
    assert a["output_ids"] == b["output_ids"] and len(a["output_ids"]) == 6


def test_transformers_loads_the_tiny_checkpoint_unchanged(tiny_model):
    path = tiny_model("qwen3")
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 50257 and tok.eos_token_id == 50256
    assert tok.decode(tok.encode("Hello, world")) == "Hello, world"
    assert "<|assistant|>" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert type(AutoModelForCausalLM.from_pretrained(path)).__name__ == "Qwen3ForCausalLM"


def test_prompt_longer_than_context_is_rejected(tiny_model):
    with Engine(str(tiny_model("llama")), dtype="float32", context_length=32) as engine:
        with pytest.raises(ValueError, match="context length is 32"):
            engine.generate(input_ids=list(range(40)))
        out = engine.generate(input_ids=list(range(30)), sampling_params={"max_new_tokens": 10, "ignore_eos": True})
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 2}


def test_unknown_sampling_parameter_is_named():
    with pytest.raises(ValueError, match=r"unknown sampling parameter.*frobnicate"):
        SamplingParams.from_dict({"frobnicate": 1})
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams.from_dict({"top_p": 0})


def test_reserve_positions_maps_whole_pages_and_frees_them():
    pool, alloc = ReqToTokenPool(2, 64, torch.device("cpu")), PageAllocator(64, 16)
    before = alloc.available()
    locs = reserve_positions(pool, alloc, [0, 1], [0, 0], [17, 3])
    assert alloc.available() == before - 3 * 16
    assert locs.numel() == 20 and len(set(locs.tolist())) == 20 and 0 not in locs.tolist()
    assert (locs[:16] // 16).unique().numel() == 1  # a page holds consecutive positions
    more = reserve_positions(pool, alloc, [1], [3], [16])  # still inside its first page
    assert alloc.available() == before - 3 * 16 and more.tolist() == list(range(int(locs[17]) + 3, int(locs[17]) + 16))
    assert reserve_positions(pool, alloc, [0], [17], [17 + 16 * 10]) is None  # nothing taken
    assert alloc.available() == before - 3 * 16
    alloc.free_slots(pool.table[0, :32].long())
    alloc.free_slots(pool.table[1, :16].long())
    assert alloc.available() == before


def test_seeded_sampling_is_reproducible_and_filters_apply():
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(-1)
    params = [
        SamplingParams(temperature=1.0, seed=7),
        SamplingParams(top_k=1),
        SamplingParams(top_k=5, temperature=2.0),
    ]
    sb = SamplingBatch.build(params, [0, 0, 0], 1000, torch.device("cpu"))
    a, b = Sampler(1, torch.device("cpu"))(logits, sb), Sampler(2, torch.device("cpu"))(logits, sb)
    assert a[0] == b[0] and a[1] == greedy[1]
    top5 = set(logits[2].topk(5).indices.tolist())
    draws = {int(Sampler(s, torch.device("cpu"))(logits, sb)[2]) for s in range(50)}
    assert draws <= top5 and len(draws) > 1
