"""Quantize a checkpoint with llmcompressor, the way users make the checkpoints Arbor loads.

llmcompressor pins transformers <= 5.17, so it lives in a venv of its own, outside Arbor's
dependencies (`scripts/quantizer_venv.sh` makes it); run this file with that venv's python:

    Q=~/.cache/arbor-peers/llmcompressor/venv/bin/python
    $Q benchmarks/quantize.py MODEL OUT --scheme w4a16-gptq
    $Q benchmarks/quantize.py /tmp/base tests/data/quant/w4a16 --scheme w4a16-gptq --tiny --group 64 \
        --calib 8 --tokenizer "$(python benchmarks/make_eval_models.py --print target)"

Schemes (compressed-tensors checkpoints):
  w8a16         int8 weights, per output channel, symmetric (round to nearest, no data)
  w4a16-gptq    int4 weights, groups of 128 (of 64 where rows are shorter), symmetric, GPTQ
  w4a16-asym    int4 weights, groups, asymmetric (zero points), GPTQ
  w8a8-sq       SmoothQuant, then int8 weights per channel and int8 activations per token (dynamic)
  fp8           float8_e4m3 weights per channel, dynamic per-token float8 activations
`--lm-head` quantizes the LM head as well (a tied one is untied: the embedding stays in the
model's dtype). Calibration uses `--calib` windows of 256 tokens from the standard library's training split
(`eval_data.py`, the eval models' tokenizer), or random ids for tiny test models.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


def recipe(scheme: str, group: int, lm_head: bool = False) -> list:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    ignore = [] if lm_head else ["lm_head"]
    if scheme == "w8a16":
        return [QuantizationModifier(targets="Linear", scheme="W8A16", ignore=ignore)]
    if scheme == "fp8":
        return [QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=ignore)]
    if scheme == "w8a8-sq":
        return [
            SmoothQuantModifier(smoothing_strength=0.8),
            GPTQModifier(targets="Linear", scheme="W8A8", ignore=ignore),
        ]
    if scheme.startswith("w4a16"):
        weights = QuantizationArgs(
            num_bits=4, type="int", symmetric=scheme != "w4a16-asym", strategy="group", group_size=group
        )
        return [
            GPTQModifier(
                ignore=ignore, config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)}
            )
        ]
    raise SystemExit(f"unknown scheme {scheme!r}")


def calibration(model: Path, count: int, length: int, vocab: int):
    from datasets import Dataset

    sys.path.insert(0, str(Path(__file__).parent))
    if (model / "tokenizer.json").exists() and vocab >= 50257:
        import eval_data

        windows = eval_data.train_windows(model, count, length)
    else:
        rng = random.Random(0)
        windows = [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]
    return Dataset.from_dict({"input_ids": windows, "attention_mask": [[1] * len(w) for w in windows]})


def write_tiny(out: Path) -> Path:
    """A random tiny Llama (seed 0, vocabulary 256) for the test suite's quantized checkpoints."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--scheme", required=True)
    ap.add_argument("--group", type=int, default=128, help="int4 group size (halved until it divides every row)")
    ap.add_argument("--calib", type=int, default=64, help="calibration windows")
    ap.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="a directory with tokenizer.json (default: the model's; llmcompressor wants one)",
    )
    ap.add_argument("--tiny", action="store_true", help="first write a random tiny Llama to MODEL (tests/data)")
    ap.add_argument(
        "--lm-head",
        action="store_true",
        help="quantize the LM head too (llmcompressor's examples leave it out; on a small model it is "
        "most of the weight bytes a decode step reads)",
    )
    args = ap.parse_args()
    if args.tiny:
        write_tiny(args.model)
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="float32")
    cfg = model.config
    group = args.group
    while cfg.hidden_size % group or cfg.intermediate_size % group:
        group //= 2
    data = calibration(args.model, args.calib, 256, cfg.vocab_size)
    oneshot(
        model=model,
        tokenizer=str(args.tokenizer or args.model),
        recipe=recipe(args.scheme, group, args.lm_head),
        dataset=data,
        num_calibration_samples=args.calib,
        max_seq_length=256,
        output_dir=str(args.out),
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        src = args.model / name
        if src.exists() and not (args.out / name).exists():
            (args.out / name).write_bytes(src.read_bytes())
    print(args.out)


if __name__ == "__main__":
    main()
