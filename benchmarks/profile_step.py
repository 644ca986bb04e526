"""Where one scheduler step's time goes: decode and prefill at batch 1, 16, 64 and 256.

Each step is the real `Scheduler.step()` on a real checkpoint (the peer checkpoint when it is
there, else the medium tiny Llama), timed part by part with wall clocks around the model's
own modules (CPU ops are synchronous, so a wall clock is the op's cost):

  GEMMs            the q/k/v, o, gate/up and down projections
  attention        the attention backend (its plan, gather, softmax and matmuls)
  norm/rope/act    RMSNorm, rotary embedding, SiLU-and-mul
  other forward    embedding, views, residual adds: the rest of the model's forward
  LM head          the logits matmul (and its float32 cast)
  sampling         logits -> token ids, penalties and masks
  scheduler        the rest of `step()`: batch building, KV bookkeeping, finishing
  IPC+detok        the step's outputs encoded, sent over a real ZMQ ipc socket, decoded and
                   detokenized; this runs in the detokenizer process, beside the next step

A second pass under torch.profiler splits attention into gather (index/copy), softmax
(softmax/exp/max/logsumexp), matmul (bmm/mm) and fused SDPA. Table on stdout; with
`--save NAME`, JSON + PNG into docs/benchmarks/ (profile_NAME.*).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
PEER_CKPT = Path.home() / ".cache" / "arbor-peers" / "ckpt"
PARTS = ["GEMMs", "attention", "norm/rope/act", "other forward", "LM head", "sampling", "scheduler", "IPC+detok"]
ATTN_PARTS = {
    "gather": ("index", "gather", "copy", "cat", "contiguous", "clone", "unflatten", "select", "slice"),
    "softmax": ("softmax", "exp", "max", "logsumexp", "sub", "amax", "log"),
    "matmul": ("bmm", "mm", "matmul", "baddbmm"),
    "fused sdpa": ("scaled_dot_product", "flash_attention"),
}


class Clock:
    """Accumulates wall time per part; `wrap` times a callable into a part."""

    def __init__(self) -> None:
        self.t: dict[str, float] = defaultdict(float)
        self.depth = 0

    def wrap(self, part: str, fn: Callable, outer: bool = False) -> Callable:
        """`outer` parts (the whole forward) contain others; other parts nested in a timed
        part count towards the outermost one."""

        def timed(*a: Any, **k: Any) -> Any:
            if self.depth and not outer:
                return fn(*a, **k)
            self.depth += not outer
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[part] += time.perf_counter() - t0
                self.depth -= not outer

        return timed


def instrument(sched: Any, clock: Clock) -> None:
    """Wrap the model's parts and the sampler so `clock` sees each one."""
    from torch import nn

    from arbor.runtime.model.layers import ParallelLinear
    from arbor.runtime.model.packed_linear import PackedLinear

    model = sched.runner.model
    for module in model.modules():
        if isinstance(module, (ParallelLinear, nn.Linear, PackedLinear)):
            module.forward = clock.wrap("GEMMs", module.forward)
        if hasattr(module, "kernel"):  # RMSNorm
            module.kernel = clock.wrap("norm/rope/act", module.kernel)
        if hasattr(module, "act"):  # GatedMLP
            module.act = clock.wrap("norm/rope/act", module.act)
    rotary = model.layers[0].self_attn.rotary
    rotary.kernel = clock.wrap("norm/rope/act", rotary.kernel)
    backend = sched.runner.attn_backend
    backend.forward = clock.wrap("attention", backend.forward)
    backend.init_forward_metadata = clock.wrap("attention", backend.init_forward_metadata)
    model.logits = clock.wrap("LM head", model.logits)
    sched.runner.forward = clock.wrap("forward", sched.runner.forward, outer=True)
    sched.sampler = clock.wrap("sampling", sched.sampler)


def make_scheduler(path: str, dtype: str, batch: int, context: int) -> Any:
    from arbor.runtime.config import ServerArgs
    from arbor.runtime.scheduler.scheduler import Scheduler

    args = ServerArgs.from_flags(
        dtype=dtype,
        max_running_requests=batch,
        max_total_tokens=batch * (context + 64) + 4096,
        max_prefill_tokens=max(8192, batch * context),
        chunked_prefill_size=0,
        disable_radix_cache=True,
    )
    return Scheduler(args, path)


def add_requests(sched: Any, batch: int, prompt_len: int, max_new: int, rng: random.Random) -> None:
    from arbor.runtime.io.messages import TokenizedGenerateReq, pack_ids
    from arbor.runtime.sampling.params import SamplingParams

    vocab = min(sched.runner.config.vocab_size, 50000)
    for _ in range(batch):
        ids = [rng.randrange(vocab) for _ in range(prompt_len)]
        sched.add(
            TokenizedGenerateReq(
                rid=f"r{rng.random()}",
                input_ids=pack_ids(ids),
                stream=True,
                sampling=SamplingParams(max_new_tokens=max_new, temperature=0, ignore_eos=True),
            )
        )


def abort_all(sched: Any) -> None:
    for req in list(sched.running):
        sched.abort(req.rid)


def ipc_detok_ms(outs: list, tokenizer: Any) -> float:
    """Encode the step's outputs, send them over a real ipc socket, decode, detokenize."""
    import zmq

    from arbor.runtime.io.detokenizer import IncrementalDetokenizer
    from arbor.runtime.io.ipc import IpcDir, Puller, Pusher
    from arbor.runtime.io.messages import BatchTokenOut, ToDetokenizer

    ctx, d = zmq.Context(), IpcDir()
    pull = Puller(ctx, d.endpoint("p"), ToDetokenizer)
    push = Pusher(ctx, d.endpoint("p"))
    detok = IncrementalDetokenizer(tokenizer)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        push.send(BatchTokenOut(outs=outs))
        msg = pull.recv(timeout_ms=5000)
        detok.feed(msg.outs)
        times.append(time.perf_counter() - t0)
        detok.streams.clear()
    push.close()
    pull.close()
    ctx.term()
    d.close()
    return statistics.median(times) * 1e3


def measure(
    sched: Any, clock: Clock, kind: str, batch: int, prompt_len: int, steps: int, tokenizer: Any, rng: random.Random
) -> dict[str, float]:
    """Median per-part ms over `steps` steps of `kind` (decode or prefill) at `batch`."""
    rows = []
    last_outs: list = []
    for _ in range(steps + 1):  # the first step of each is a warm-up
        if kind == "prefill":
            add_requests(sched, batch, prompt_len, 4, rng)
        clock.t.clear()
        t0 = time.perf_counter()
        last_outs = sched.step()
        total = time.perf_counter() - t0
        if kind == "prefill":
            abort_all(sched)
        rows.append({**clock.t, "step": total})
    rows = rows[1:]
    med = {k: statistics.median(r.get(k, 0.0) for r in rows) * 1e3 for k in rows[0]}
    model_parts = sum(med.get(p, 0.0) for p in ("GEMMs", "attention", "norm/rope/act", "LM head"))
    med["other forward"] = med.get("forward", 0.0) - model_parts
    med["scheduler"] = med["step"] - med.get("forward", 0.0) - med.get("sampling", 0.0)
    med["IPC+detok"] = ipc_detok_ms(last_outs, tokenizer) if last_outs else 0.0
    return {p: med.get(p, 0.0) for p in PARTS} | {"step": med["step"]}


def attention_split(sched: Any, kind: str, batch: int, prompt_len: int, rng: random.Random) -> dict[str, float]:
    """One step under torch.profiler; attention's op time (ms) by kind of op."""
    from torch.profiler import ProfilerActivity, profile, record_function

    backend = sched.runner.attn_backend
    inner = backend.forward

    def labelled(*a: Any, **k: Any) -> Any:
        with record_function("arbor::attention"):
            return inner(*a, **k)

    backend.forward = labelled
    if kind == "prefill":
        add_requests(sched, batch, prompt_len, 4, rng)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        sched.step()
    backend.forward = inner
    if kind == "prefill":
        abort_all(sched)
    split: dict[str, float] = defaultdict(float)

    def walk(ev: Any) -> None:
        for child in ev.cpu_children:
            name = child.name.removeprefix("aten::")
            part = next((p for p, keys in ATTN_PARTS.items() if any(k in name for k in keys)), "other")
            split[part] += child.self_cpu_time_total / 1e3
            walk(child)

    for ev in prof.events():
        if ev.name == "arbor::attention":
            walk(ev)
    return dict(split)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", default=None, help="checkpoint (default: the peer checkpoint, else a tiny one)")
    ap.add_argument("--batches", default="1,16,64,256", help="batch sizes to profile")
    ap.add_argument("--context", type=int, default=512, help="tokens already cached per request in decode")
    ap.add_argument("--prefill-len", type=int, default=128, help="prompt tokens per request in the prefill step")
    ap.add_argument("--steps", type=int, default=5, help="steps measured per cell (median)")
    ap.add_argument("--dtype", default="auto", help="auto = bfloat16 where the CPU has avx512_bf16/AMX, else float32")
    ap.add_argument("--save", default=None, help="write docs/benchmarks/profile_SAVE.{json,png}")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from arbor.runtime.model.runner import resolve_dtype
    from arbor.runtime.tiny_model import TinySpec, make_tiny_model

    path = args.model_path or (
        str(PEER_CKPT)
        if PEER_CKPT.exists()
        else str(
            make_tiny_model(
                Path(tempfile.mkdtemp()) / "medium", TinySpec(arch="llama", layers=8, hidden=512, heads=8, kv_heads=2)
            )
        )
    )
    dtype = str(resolve_dtype(args.dtype, torch.device("cpu"))).removeprefix("torch.")
    tokenizer = AutoTokenizer.from_pretrained(path)
    rng = random.Random(0)
    cells: list[dict[str, Any]] = []
    for batch in (int(b) for b in args.batches.split(",")):
        sched = make_scheduler(path, dtype, batch, max(args.context, args.prefill_len))
        clock = Clock()
        instrument(sched, clock)
        prefill = measure(sched, clock, "prefill", batch, args.prefill_len, args.steps, tokenizer, rng)
        cells.append(
            {
                "kind": "prefill",
                "batch": batch,
                "parts": prefill,
                "attention_ops": attention_split(sched, "prefill", batch, args.prefill_len, rng),
            }
        )
        add_requests(sched, batch, args.context, args.steps + 10, rng)
        while sched.waiting:
            sched.step()
        decode = measure(sched, clock, "decode", batch, args.context, args.steps, tokenizer, rng)
        cells.append(
            {
                "kind": "decode",
                "batch": batch,
                "parts": decode,
                "attention_ops": attention_split(sched, "decode", batch, args.context, rng),
            }
        )
        sched.close()
    result = {
        "model": path,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "context": args.context,
        "prefill_len": args.prefill_len,
        "backend": type(sched.runner.attn_backend).__name__,
        "cells": cells,
    }
    report(result)
    if args.save:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"profile_{args.save}.json").write_text(json.dumps(result, indent=2))
        chart(result, OUT / f"profile_{args.save}.png")


def report(r: dict[str, Any]) -> None:
    print(
        f"profile_step: {r['model']}, {r['dtype']}, {r['threads']} threads, {r['backend']}; decode at "
        f"{r['context']} cached tokens/request, prefill {r['prefill_len']} tokens/request; median ms per step"
    )
    head = f"{'step':>8} {'batch':>5} " + " ".join(f"{p:>13}" for p in PARTS) + f" {'total':>9}"
    print(head)
    for c in r["cells"]:
        p = c["parts"]
        print(f"{c['kind']:>8} {c['batch']:>5} " + " ".join(f"{p[k]:>13.2f}" for k in PARTS) + f" {p['step']:>9.2f}")
    print("\nattention ops (ms, one profiled step; profiler overhead included)")
    for c in r["cells"]:
        ops = c["attention_ops"]
        print(f"{c['kind']:>8} {c['batch']:>5}  " + "  ".join(f"{k} {v:.2f}" for k, v in sorted(ops.items())))


def chart(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, kind in zip(axes, ("decode", "prefill")):
        cells = [c for c in r["cells"] if c["kind"] == kind]
        labels = [str(c["batch"]) for c in cells]
        bottom = [0.0] * len(cells)
        for i, part in enumerate(PARTS):
            share = [100 * c["parts"][part] / max(c["parts"]["step"], 1e-9) for c in cells]
            ax.bar(labels, share, bottom=bottom, label=part, color=f"C{i}")
            bottom = [b + s for b, s in zip(bottom, share)]
        ax.set_xlabel("batch")
        ax.set_ylabel("% of the step")
        ax.set_title(f"{kind} step")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Where a step's time goes ({r['dtype']}, {r['backend']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
