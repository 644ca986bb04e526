"""Quantize a checkpoint into GPTQ's layout (`qweight`/`qzeros`/`scales`/`g_idx`, AutoGPTQ's
format v1) with Intel Neural Compressor's GPTQ, which runs on CPUs.

INC pins its own stack, so it runs from a venv of its own (`scripts/quantizer_venv.sh --gptq`):

    ~/.cache/arbor-peers/gptq/venv/bin/python benchmarks/quantize_gptq.py MODEL OUT \
        [--bits 4] [--group 128] [--act-order] [--asym] [--tiny] [--oracle]

`--tiny` first writes the random tiny Llama of tests/data/quant to MODEL; `--oracle` also writes
`dequantized_by_inc.safetensors`, every quantized layer's weight as INC's own `recover()`
returns it. Calibration: as `quantize.py` (random ids for tiny models).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from quantize import calibration, write_tiny

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--group", type=int, default=128, help="columns per group; -1: one per output channel")
    ap.add_argument("--act-order", action="store_true", help="GPTQ's desc_act: quantize columns by Hessian order")
    ap.add_argument("--asym", action="store_true", help="zero points (default: symmetric)")
    ap.add_argument("--calib", type=int, default=32, help="calibration windows of 256 tokens")
    ap.add_argument("--tiny", action="store_true", help="first write a random tiny Llama to MODEL (tests/data)")
    ap.add_argument("--oracle", action="store_true", help="also write INC's own dequantized weights")
    args = ap.parse_args()
    import torch
    from neural_compressor.torch.algorithms.weight_only.modules import INCWeightOnlyLinear
    from neural_compressor.torch.quantization import GPTQConfig, convert, prepare, save
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    if args.tiny:
        write_tiny(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32).eval()
    windows = calibration(args.model, args.calib, 256, model.config.vocab_size)["input_ids"]
    config = GPTQConfig(
        bits=args.bits, group_size=args.group, use_sym=not args.asym, act_order=args.act_order, true_sequential=False
    )
    model = prepare(model, config)
    with torch.no_grad():
        for ids in windows:
            model(torch.tensor([ids]))
    model = convert(model)
    save(model, str(args.out), format="huggingface")
    for name in TOKENIZER_FILES:  # INC saves weights and config only; servers need the tokenizer too
        if (Path(args.model) / name).exists():
            shutil.copy(Path(args.model) / name, args.out / name)
    if args.oracle:
        weights = {
            f"{name}.weight": m.recover().float().contiguous()
            for name, m in model.named_modules()
            if isinstance(m, INCWeightOnlyLinear)
        }
        save_file(weights, str(args.out / "dequantized_by_inc.safetensors"))
    print(args.out)


if __name__ == "__main__":
    main()
