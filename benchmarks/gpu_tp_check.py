"""TP=2 over NCCL against TP=1 on CUDA, with the Triton attention backend: fp32 greedy tokens
must be equal. It needs two GPUs; with fewer it says so and exits 0 without checking anything.

    .venv/bin/python benchmarks/gpu_tp_check.py
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import torch

from arbor import Engine
from arbor.runtime.tiny_model import TinySpec, make_tiny_model

SPEC = TinySpec(arch="llama", layers=4, hidden=256, heads=8, kv_heads=2)


def main() -> int:
    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(f"TP=2 over NCCL: NOT RUN ({gpus} CUDA device(s); it needs 2)")
        return 0
    path = make_tiny_model(Path(tempfile.mkdtemp()) / "tp", SPEC)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 30000) for _ in range(rng.randint(8, 300))] for _ in range(8)]
    greedy = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
    outs = {}
    for tp in (1, 2):
        with Engine(str(path), dtype="float32", device="cuda", attention_backend="triton", tp_size=tp) as engine:
            outs[tp] = [
                o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=greedy, progress=False)
            ]
    same = sum(a == b for a, b in zip(outs[1], outs[2], strict=True))
    print(f"TP=2 over NCCL vs TP=1, triton backend, fp32: {same}/{len(prompts)} greedy outputs equal")
    return 0 if same == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
