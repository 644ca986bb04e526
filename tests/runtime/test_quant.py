"""Quantized checkpoints written by llmcompressor, AutoAWQ and Intel Neural Compressor's GPTQ
(tests/data/quant, see its README): Arbor's logits against transformers' dequantized model, each kernel against its dequantize-then-
matmul reference, greedy decoding, and a clear refusal of every scheme Arbor lacks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, CompressedTensorsConfig

from arbor import Engine
from arbor.kernels import cpu_ops
from arbor.kernels.reference import woq_dequantize_ref
from arbor.runtime.config import CacheArgs, ModelArgs
from arbor.runtime.kv.pool import reserve_positions
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.model_config import CheckpointError, ModelConfig
from arbor.runtime.model.quant.formats import unpack_int32
from arbor.runtime.model.quant.linear import QuantLinear
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.tiny_model import write_gpt2_tokenizer

DATA = Path(__file__).resolve().parents[1] / "data" / "quant"
# awq: AutoAWQ's GEMM layout; gptq (int4, groups, act-order, zero points) and gptq8 (int8 per
# channel, symmetric): GPTQ's layout
WEIGHT_ONLY = ["w8a16", "w4a16", "w4a16-asym", "w4a16-head", "awq", "gptq", "gptq8"]
INT4 = {"w4a16", "w4a16-asym", "w4a16-head", "awq", "gptq"}
# the tool's own dequantized weights, written beside checkpoints that transformers cannot load here
ORACLES = {
    "awq": "dequantized_by_autoawq.safetensors",
    "gptq": "dequantized_by_inc.safetensors",
    "gptq8": "dequantized_by_inc.safetensors",
}
WITH_ACTIVATIONS = ["w8a8", "fp8"]  # activations quantized per token: a looser match to the float model
PACKED_KEYS = (".qweight", ".qzeros", ".scales", ".g_idx", ".bias", ".scale_bf16_to_fp8")
PROMPTS = [[5, 17, 99, 3, 250, 8, 8, 41], [7] * 3, list(range(30, 90))]


def _hf(path: Path):
    """transformers' model with the dequantized weights: compressed-tensors decompresses its own;
    for AutoAWQ's and GPTQ's layouts, the weights the quantizer itself dequantized (`ORACLES`)."""
    if path.name not in ORACLES:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, quantization_config=CompressedTensorsConfig(run_compressed=False)
        ).eval()
    config = AutoConfig.from_pretrained(path)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    state = {k: v.float() for k, v in load_file(path / "model.safetensors").items() if not k.endswith(PACKED_KEYS)}
    state |= load_file(path / ORACLES[path.name])
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing)  # tied: lm_head is the embedding
    return model


def _logits(runner: ModelRunner, prompts: list[list[int]]) -> list[torch.Tensor]:
    rows = [runner.req_to_token.alloc() for _ in prompts]
    ends = [len(p) for p in prompts]
    loc = reserve_positions(runner.req_to_token, runner.allocator, rows, [0] * len(prompts), ends)
    batch = ForwardBatch.build(
        ForwardMode.EXTEND, prompts, [0] * len(prompts), rows, loc, runner.req_to_token.table, return_all_logits=True
    )
    out = runner.forward(batch).all_logits.float()
    return list(out.split(ends))


def _runner(name: str, dtype: str = "float32") -> ModelRunner:
    return ModelRunner(ModelArgs(dtype=dtype), CacheArgs(max_total_tokens=1024), 64, str(DATA / name))


@pytest.mark.parametrize("name", WEIGHT_ONLY + WITH_ACTIVATIONS)
def test_logits_match_the_dequantized_model_in_transformers(name: str) -> None:
    """fp32: weight-only schemes within 1e-4 of transformers' dequantized model. Schemes that
    also quantize activations per token (transformers' dequantized model does not) within a
    share of the largest logit: 5% for int8 activations, 10% for float8's 3 mantissa bits.
    INC dequantizes GPTQ in float16 (its scales' dtype), so that oracle is off by float16
    rounding: 0.1% of the largest logit."""
    runner = _runner(name)
    assert any(isinstance(m, QuantLinear) for m in runner.model.modules())
    assert isinstance(runner.model.lm_head, QuantLinear) == name.endswith("-head")  # untied by the quantizer
    hf = _hf(DATA / name)
    with torch.no_grad():
        for prompt, ours in zip(PROMPTS, _logits(runner, PROMPTS)):
            ref = hf(torch.tensor([prompt])).logits[0]
            peak = ref.abs().max().item()
            assert peak > 0.1
            bound = {"w8a8": 0.05 * peak, "fp8": 0.10 * peak, "gptq": 1e-3 * peak, "gptq8": 1e-3 * peak}.get(name, 1e-4)
            assert (ours - ref).abs().max().item() < bound


@pytest.mark.parametrize("name", WEIGHT_ONLY + WITH_ACTIVATIONS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernels_match_their_references(name: str, dtype: str) -> None:
    """Every QuantLinear's kernel against its dequantize-then-matmul reference (activations
    quantized the same way), per layer: fp32 within 1e-5 relative, bf16 within 2%."""
    runner = _runner(name, dtype)
    torch.manual_seed(0)
    for layer_name, layer in runner.model.named_modules():
        if not isinstance(layer, QuantLinear):
            continue
        for rows in (1, 5, 20):  # the decode kernel (up to 8 rows) and dequantize + GEMM
            x = torch.randn(rows, layer.in_features).to(getattr(torch, dtype))
            ours, ref = layer(x).float(), layer.reference(x).float()
            scale = ref.abs().max().item()
            assert (ours - ref).abs().max().item() <= (1e-5 if dtype == "float32" else 0.02) * scale, layer_name


@pytest.mark.parametrize("name", ["w8a16", "w4a16-asym", "fp8", "gptq8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_woq_linear_covers_every_row_block(name: str, dtype: str) -> None:
    """The CPU kernel works through blocks of 8, 4 or 2 weight rows (by the rows of x), then
    single rows: weights of 1, 3, 13 and 21 rows leave every remainder, at 1 to 8 rows of x and
    at 13 and 20 (a large weight's batches), against the dequantized weight. fp32 within 1e-5
    relative. bf16 x (int4 and int8 codes multiplied as bfloat16 pairs, where the CPU has
    AVX512-BF16; products exact, so only the sums' order and the output's rounding differ)
    within 2^-8 relative."""
    ops = cpu_ops.load()
    if ops is None:
        pytest.skip("Arbor's CPU kernels do not build here")
    w = next(m for m in _runner(name).model.modules() if isinstance(m, QuantLinear)).weight
    g = torch.Generator().manual_seed(0)
    bound = 1e-5 if dtype == "float32" else 2**-8
    for out_rows in (1, 3, 13, 21):
        codes, scale, zero = (t[:out_rows].contiguous() for t in (w.codes, w.scale, w.zero))
        dense = woq_dequantize_ref(codes, scale, zero, w.cols, w.group, w.kind)
        for rows in (*range(1, 9), 13, 20):  # past 8, blocks of 8 rows of x and the rest
            x = torch.randn(rows, w.cols, generator=g).to(getattr(torch, dtype))
            got, ref = ops.woq_linear(x, codes, scale, zero, w.group, w.kind), x.float() @ dense.T
            assert got.dtype == x.dtype
            assert (got.float() - ref).abs().max().item() <= bound * ref.abs().max().item(), (out_rows, rows)


@pytest.mark.parametrize("name", WEIGHT_ONLY + WITH_ACTIVATIONS)
def test_greedy_is_stable_and_weights_shrink(tmp_path: Path, name: str) -> None:
    """Greedy output is the same run to run and in a batch; weight-only fp32 output equals
    transformers' greedy decoding of the dequantized model."""
    params = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    path = tmp_path / name
    shutil.copytree(DATA / name, path)
    write_gpt2_tokenizer(path, 512)  # the Engine detokenizes; ids < 256 are GPT-2's byte tokens
    with Engine(str(path), dtype="float32", max_total_tokens=1024) as engine:
        alone = [engine.generate(input_ids=p, sampling_params=params)["output_ids"] for p in PROMPTS]
        together = [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=params)]
    assert alone == together
    if name in WEIGHT_ONLY:
        hf = _hf(DATA / name)
        for prompt, out in zip(PROMPTS, alone):
            ids = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
            assert ids[0, len(prompt) :].tolist() == out
    runner = _runner(name)
    layers = [m for m in runner.model.modules() if isinstance(m, QuantLinear)]
    dense = sum(4 * m.in_features * m.out_features for m in layers)  # what fp32 would take
    bits = 4 if name in INT4 else 8
    # codes at `bits`, plus a float32 scale and zero point per row and group of 64
    assert sum(m.weight_bytes() for m in layers) <= dense * (bits / 32 + 2 / 64)


@pytest.mark.parametrize("bits", [4, 8])
def test_unpack_reads_what_compressed_tensors_packs(bits: int) -> None:
    pack = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers").pack_to_int32
    g = torch.Generator().manual_seed(bits)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1))
    for cols in (8, 64, 100):
        values = torch.randint(lo, hi, (6, cols), generator=g, dtype=torch.int8)
        assert torch.equal(unpack_int32(pack(values, bits), bits, cols), values)
        assert torch.equal(unpack_int32(pack(values, bits, packed_dim=0).T.contiguous(), bits, 6), values.T)


def test_awq_decodes_to_what_autoawq_dequantizes() -> None:
    """Arbor's decode of AutoAWQ's packing (order 0, 2, 4, 6, 1, 3, 5, 7, zero points) equals
    AutoAWQ's own `dequantize_gemm`, layer by layer (q/k/v and gate/up fused in Arbor)."""
    runner = _runner("awq")
    want = load_file(DATA / "awq" / "dequantized_by_autoawq.safetensors")
    model = runner.model
    for name, layer in model.named_modules():
        if not isinstance(layer, QuantLinear):
            continue
        ours = layer.weight.dequantize()
        for hf, lo, rows in model.linear_parts(name):
            assert torch.equal(ours[lo : lo + rows], want[hf + ".weight"]), hf


@pytest.mark.parametrize("name", ["gptq", "gptq8"])
def test_gptq_decodes_to_what_inc_dequantizes(name: str) -> None:
    """Arbor's decode of GPTQ's packing (v1 zero points, act-order's g_idx) equals INC's own
    `recover()`, up to the float16 rounding INC's product carries."""
    runner = _runner(name)
    want = load_file(DATA / name / ORACLES[name])
    model, layers = runner.model, 0
    for layer_name, layer in model.named_modules():
        if not isinstance(layer, QuantLinear):
            continue
        layers += 1
        assert (layer.weight.perm is not None) == (name == "gptq")  # act-order sorts the columns by group
        ours = layer.weight.dequantize()
        for hf, lo, rows in model.linear_parts(layer_name):
            torch.testing.assert_close(ours[lo : lo + rows], want[hf + ".weight"], rtol=2**-10, atol=1e-7, msg=hf)
    assert layers == 2 * 4  # qkv, o, gate_up, down in each of 2 layers


@pytest.mark.parametrize(
    ("name", "key", "value"), [("gptq", "checkpoint_format", "marlin"), ("awq", "version", "gemv")]
)
def test_gptq_and_awq_layouts_arbor_lacks_are_refused(tmp_path: Path, name: str, key: str, value: str) -> None:
    """GPTQ formats other than v1 and v2, AWQ versions other than GEMM: refused by name."""
    path = tmp_path / "model"
    shutil.copytree(DATA / name, path)
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"][key] = value
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=f"'{value}'"):
        ModelConfig.from_dir(path)


def _with_quant(tmp_path: Path, edit) -> Path:
    path = tmp_path / "model"
    shutil.copytree(DATA / "w4a16", path)
    raw = json.loads((path / "config.json").read_text())
    edit(raw["quantization_config"])
    (path / "config.json").write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda q: q.update(quant_method="hqq"), "'hqq'"),
        (lambda q: q.update(quant_method="gptq", bits=3, group_size=64), "3-bit GPTQ"),
        (lambda q: q["config_groups"]["group_0"].update(format="marlin-24"), "'marlin-24'"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=3), "3-bit"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block"), "'block'"),
        (lambda q: q.update(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity_config"),
        (lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float"}), "kv_cache_scheme"),
        (
            lambda q: q["config_groups"]["group_0"].update(
                input_activations={"num_bits": 8, "type": "int", "dynamic": False, "strategy": "tensor"}
            ),
            "input activations",
        ),
    ],
)
def test_unsupported_schemes_are_refused_by_name(tmp_path: Path, edit, named: str) -> None:
    with pytest.raises(CheckpointError, match="not supported") as err:
        ModelConfig.from_dir(_with_quant(tmp_path, edit))
    assert named in str(err.value)
