"""Quantize a checkpoint with AutoAWQ (the AutoAWQ GEMM layout: `qweight`/`qzeros`/`scales`).

AutoAWQ pins an older transformers, so it runs from a venv of its own
(`scripts/quantizer_venv.sh --autoawq`):

    ~/.cache/arbor-peers/autoawq/venv/bin/python benchmarks/quantize_awq.py MODEL OUT [--group 128]

Calibration: windows of random token ids (the tiny test models) or, for a model with GPT-2's
vocabulary, the standard library's training split (`eval_data.py`).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--calib", type=int, default=32, help="calibration windows of 256 tokens")
    args = ap.parse_args()
    from awq import AutoAWQForCausalLM
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    if vocab >= 50257 and (args.model / "tokenizer.json").exists():
        sys.path.insert(0, str(Path(__file__).parent))
        import eval_data

        windows = eval_data.train_windows(args.model, args.calib, 256)
    else:
        rng = random.Random(0)
        windows = [[rng.randrange(vocab) for _ in range(256)] for _ in range(args.calib)]
    model = AutoAWQForCausalLM.from_pretrained(str(args.model))
    model.quantize(
        None,
        quant_config={"zero_point": True, "q_group_size": args.group, "w_bit": 4, "version": "GEMM"},
        calib_data=windows,
        n_parallel_calib_samples=None,
        max_calib_samples=args.calib,
        max_calib_seq_len=256,
    )
    model.save_quantized(str(args.out))
    print(args.out)


if __name__ == "__main__":
    main()
