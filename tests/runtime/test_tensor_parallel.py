"""Tensor parallelism over gloo: two ranks in real processes give the single-process model's
fp32 logits (within 1e-5 of the peak) and greedy tokens, for MHA, GQA with 2 and 1 KV heads
(1: the head replicated on both ranks), tied and untied LM heads, over an odd vocabulary
(50,257 ids: the last rank's slice is padded); and the ranks on the triton backend (Triton's
interpreter here) against the single process on torch."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from arbor.runtime.config import CacheArgs, ModelArgs
from arbor.runtime.kv.pool import reserve_positions
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.model_config import CheckpointError
from arbor.runtime.model.parallel import TensorParallel
from arbor.runtime.model.runner import ModelRunner
from arbor.runtime.tiny_model import TinySpec, make_tiny_model

PROMPTS = [[5, 17, 99, 3, 250, 8, 8, 41], [50256, 7, 7], list(range(30, 90))]
SLOTS = 512


def _logits(runner: ModelRunner) -> torch.Tensor:
    rows = [runner.req_to_token.alloc() for _ in PROMPTS]
    ends = [len(p) for p in PROMPTS]
    loc = reserve_positions(runner.req_to_token, runner.allocator, rows, [0] * len(PROMPTS), ends)
    batch = ForwardBatch.build(
        ForwardMode.EXTEND, PROMPTS, [0] * len(PROMPTS), rows, loc, runner.req_to_token.table, return_all_logits=True
    )
    return runner.forward(batch).all_logits.float()


def _rank(rank: int, size: int, port: int, path: str, out: str, backend: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        runner = ModelRunner(
            ModelArgs(dtype="float32", attention_backend=backend),
            CacheArgs(max_total_tokens=SLOTS),
            64,
            path,
            tp=TensorParallel(rank, size),
            num_slots=SLOTS,
        )
        logits = _logits(runner)
        if rank == 0:
            save_file({"logits": logits.contiguous()}, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("kv_heads", "tied", "backend"),
    [(4, False, "torch"), (2, True, "torch"), (1, False, "torch"), (2, False, "triton")],
)
def test_two_ranks_match_one(tmp_path: Path, kv_heads: int, tied: bool, backend: str) -> None:
    path = make_tiny_model(
        tmp_path / "model",
        TinySpec(layers=2, hidden=64, heads=4, kv_heads=kv_heads, intermediate=96, tie_word_embeddings=tied),
    )
    single = _logits(
        ModelRunner(ModelArgs(dtype="float32"), CacheArgs(max_total_tokens=SLOTS), 64, str(path), num_slots=SLOTS)
    )
    out = tmp_path / "tp2.safetensors"
    mp.start_processes(_rank, args=(2, _free_port(), str(path), str(out), backend), nprocs=2, start_method="spawn")
    split = load_file(out)["logits"]
    assert split.shape == single.shape == (sum(map(len, PROMPTS)), 50257)
    peak = single.abs().max().item()
    assert peak > 0.1
    assert (split - single).abs().max().item() <= 1e-5 * peak
    assert torch.equal(split.argmax(-1), single.argmax(-1))


def test_shapes_that_do_not_split_are_refused(tmp_path: Path) -> None:
    path = make_tiny_model(tmp_path / "model", TinySpec(layers=1, hidden=48, heads=3, kv_heads=3))
    with pytest.raises(CheckpointError, match="--tp-size 2 must divide the 3 attention heads"):
        from arbor.runtime.model.loader import load_model

        load_model(path, torch.float32, torch.device("cpu"), TensorParallel(0, 2))
