"""Scale-out on this machine: tensor parallelism (TP=1 vs TP=2 through the Engine) and data
parallelism (`arbor serve --dp-size 2` behind sglang-router, cache_aware against round_robin,
next to one worker).

The medium tiny Llama (8 layers, hidden 512, 8 heads, 4 KV heads), bf16 where the CPU has
fast bf16, else fp32. On a 2-core CPU the ranks or workers split the same two cores, so these
figures measure correctness and overhead (all-reduce time per step, routing), not speed-up.

    .venv/bin/python benchmarks/bench_scale.py [--sections tp,dp] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import SPEC, chat_trace, poisson_run, start_server, stop_server
from peers import dtype_name

from arbor.runtime.tiny_model import make_tiny_model

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
DP_SYSTEMS = {
    "DP=1": [],
    "DP=2 cache_aware": ["--dp-size", "2"],
    "DP=2 round_robin": ["--dp-size", "2", "--router-policy", "round_robin"],
}


def tp_cells(model: Path, dtype: str, tp: int, repeats: int) -> dict[str, float]:
    """Decode tok/s at batch 1 and 16 (128 tokens each), prefill tok/s (8 x 512-token
    prompts), and the collectives' wall time per forward step (TP > 1)."""
    from arbor import Engine

    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 30000) for _ in range(32)] for _ in range(16)]
    long = [[rng.randrange(1000, 30000) for _ in range(512)] for _ in range(8)]
    greedy = {"max_new_tokens": 128, "temperature": 0, "ignore_eos": True}
    cells: dict[str, float] = {}
    with Engine(str(model), dtype=dtype, tp_size=tp, max_running_requests=64) as engine:
        engine.generate(input_ids=prompts[:2], sampling_params={"max_new_tokens": 8}, progress=False)
        for b in (1, 16):
            before = engine.stats()
            cells[f"decode_b{b}"] = (
                b
                * 128
                / _median(
                    repeats,
                    lambda b=b: engine.generate(input_ids=prompts[:b], sampling_params=greedy, progress=False),
                    engine,
                )
            )
            after = engine.stats()
            steps = after["decode_steps"] + after["prefill_steps"] - before["decode_steps"] - before["prefill_steps"]
            if tp > 1:
                comm = after["tp_collective_s"] - before["tp_collective_s"]
                cells[f"collective_ms_per_step_b{b}"] = comm / steps * 1e3
        cells["prefill"] = sum(map(len, long)) / _median(
            repeats,
            lambda: engine.generate(input_ids=long, sampling_params={"max_new_tokens": 1}, progress=False),
            engine,
        )
        outs = engine.generate(input_ids=prompts[:4], sampling_params=greedy, progress=False)
        cells["greedy_ids"] = [o["output_ids"] for o in outs]
    return cells


def _median(repeats: int, run: Any, engine: Any) -> float:
    times = []
    for _ in range(repeats):
        engine.flush_cache()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def dp_cells(model: Path, dtype: str, flags: list[str], convs: int, turns: int, rate: float, n: int) -> dict[str, Any]:
    """The multi-turn chat trace (text, so the router can match prefixes) and Poisson mixed
    traffic, through one server or a router-fronted fleet."""
    proc, port = start_server(model, "--dtype", dtype, *flags)
    try:
        _wait_listed(port)
        chat = asyncio.run(chat_trace(port, model.name, convs, turns))
        mixed = asyncio.run(poisson_run(port, rate, n, seed=0))
    finally:
        stop_server(proc)
    return {"chat": chat, "mixed": mixed}


def _wait_listed(port: int, timeout_s: float = 120) -> None:
    """Until /v1/models lists the model (a router answers /health before its workers register)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        if r.status_code == 200 and r.json()["data"]:
            return
        time.sleep(0.5)
    raise RuntimeError("the server never listed its model")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="tp,dp", help="comma-separated: tp, dp")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per TP cell (median)")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson rate of the mixed workload (requests/s)")
    ap.add_argument("--requests", type=int, default=40, help="requests of the mixed workload")
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run (nothing saved)")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.conversations, args.turns, args.requests = 1, 2, 2, 6
    sections = set(args.sections.split(","))
    dtype = dtype_name()
    model = make_tiny_model(Path(tempfile.mkdtemp()) / "medium", SPEC)
    saved = OUT / "bench_scale.json"
    result: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() and not args.quick else {}
    result.update(
        dtype=dtype, spec={"layers": SPEC.layers, "hidden": SPEC.hidden, "heads": SPEC.heads, "kv_heads": SPEC.kv_heads}
    )
    if "tp" in sections:
        result["tp"] = {f"TP={tp}": tp_cells(model, dtype, tp, args.repeats) for tp in (1, 2)}
        ids = [c.pop("greedy_ids") for c in result["tp"].values()]
        result["tp_greedy_equal"] = ids[0] == ids[1]
    if "dp" in sections:
        result["dp"] = {
            name: dp_cells(model, dtype, flags, args.conversations, args.turns, args.rate, args.requests)
            for name, flags in DP_SYSTEMS.items()
        }
    report(result)
    if not args.quick:
        OUT.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(result, indent=2))
        chart(result)


def report(r: dict[str, Any]) -> None:
    print(f"\nmedium tiny Llama, {r['dtype']}, 2-core CPU")
    if "tp" in r:
        print("| system | decode b1 tok/s | decode b16 tok/s | prefill tok/s | collectives ms/step (b1, b16) |")
        print("|---|---|---|---|---|")
        base = r["tp"]["TP=1"]
        for name, c in r["tp"].items():
            comm = (
                f"{c['collective_ms_per_step_b1']:.2f}, {c['collective_ms_per_step_b16']:.2f}"
                if "collective_ms_per_step_b1" in c
                else "-"
            )
            print(
                f"| {name} | {c['decode_b1']:.1f} ({c['decode_b1'] / base['decode_b1']:.2f}x) | "
                f"{c['decode_b16']:.1f} ({c['decode_b16'] / base['decode_b16']:.2f}x) | "
                f"{c['prefill']:.0f} ({c['prefill'] / base['prefill']:.2f}x) | {comm} |"
            )
        print(f"greedy tokens TP=2 == TP=1: {r['tp_greedy_equal']}")
    if "dp" in r:
        print(
            "\n| system | chat tok/s | chat TTFT p50/p99 ms | chat cache hit | mixed tok/s | mixed TTFT p50/p99 ms "
            "| mixed TPOT p50/p99 ms |"
        )
        print("|---|---|---|---|---|---|---|")
        for name, c in r["dp"].items():
            ch, mx = c["chat"], c["mixed"]
            chat_tok_s = ch["conversations"] * ch["turns"] * 32 / ch["wall_s"]
            print(
                f"| {name} | {chat_tok_s:.1f} | {ch['ttft_p50_ms']:.0f} / {ch['ttft_p99_ms']:.0f} | "
                f"{ch['hit_rate']:.1%} | {mx['throughput_tok_s']:.1f} | {mx['ttft_p50_ms']:.0f} / "
                f"{mx['ttft_p99_ms']:.0f} | {mx['tpot_p50_ms']:.1f} / {mx['tpot_p99_ms']:.1f} |"
            )


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    if "tp" in r:
        names = list(r["tp"])
        keys = ("decode_b1", "decode_b16")
        for i, key in enumerate(keys):
            axes[0].bar([x + i * 0.4 for x in range(len(names))], [r["tp"][n][key] for n in names], 0.4, label=key)
        axes[0].set_xticks([x + 0.2 for x in range(len(names))], names)
        axes[0].set_ylabel("tokens/s")
        axes[0].set_title("Tensor parallelism, decode")
        axes[0].legend()
    if "dp" in r:
        names = list(r["dp"])
        axes[1].bar(names, [r["dp"][n]["chat"]["hit_rate"] * 100 for n in names], color="tab:green")
        axes[1].set_ylabel("chat trace cache hit rate (%)")
        axes[1].set_title("Data parallelism behind sglang-router")
        axes[1].tick_params(axis="x", labelsize=8)
    fig.suptitle(f"Scale-out, medium tiny Llama, {r['dtype']}, 2-core CPU (correctness and overhead)")
    fig.tight_layout()
    fig.savefig(OUT / "bench_scale.png", dpi=100)


if __name__ == "__main__":
    main()
