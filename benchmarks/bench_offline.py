"""Offline throughput: Arbor beside vLLM's CPU build, llama.cpp's server and transformers,
then Arbor's own radix-cache and scheduler-overhead checks.

(peers) on the transformers-written peer checkpoint (`benchmarks/peers.py` says where each
    system comes from and how it is run), every system sent all requests at once over
    /v1/completions, median of `--repeats` runs:
    W1 mixed (64 requests, in 32-256, out 16-128), W2 (a shared 1,024-token prefix,
    32 x (32 in, 32 out)), and a multi-turn chat replay (8 conversations x 4 turns).
    transformers runs W1 and W2 in-process (`generate`, best batch size).
(a) mixed: seeded requests (input 32-512, output 16-256 tokens, ignore_eos); transformers runs
    length-sorted, padded batches at the best of several batch sizes (tried on a sample).
(b) few-shot (one shared ~1,500-token prefix + short questions) and multi-turn chat
    (each turn's prompt = the whole conversation so far): Arbor with the radix cache on vs
    off vs transformers; cache hit rate against the offline optimum (every token some
    earlier request computed, at most len - 1 per prompt).
(c) scheduler overhead per decode step at batch 256 with the model forward replaced by a
    no-op: the step minus forward minus sampling, and the sampling cost on its own.

Throughput counts requested output tokens only (padding and overshoot are waste).
Table on stdout; JSON + PNG into docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from arbor.radix.cache import RadixCache
from arbor.runtime.engine import Engine
from arbor.runtime.tiny_model import TinySpec, make_tiny_model

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
JSON = OUT / "bench_offline.json"
SPEC = TinySpec(arch="llama", layers=8, hidden=512, heads=8, kv_heads=4)
VOCAB = 50000
Workload = list[tuple[list[int], int]]  # (prompt ids, output tokens)


def mixed_workload(n: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    return [([rng.randrange(VOCAB) for _ in range(rng.randint(32, 512))], rng.randint(16, 256)) for _ in range(n)]


def fewshot_workload(n: int, prefix_len: int = 1500, seed: int = 1) -> Workload:
    rng = random.Random(seed)
    prefix = [rng.randrange(VOCAB) for _ in range(prefix_len)]
    return [(prefix + [rng.randrange(VOCAB) for _ in range(rng.randint(16, 48))], 16) for _ in range(n)]


def greedy(out_len: int) -> dict[str, Any]:
    return {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True}


# ---------------------------------------------------------------- systems


def arbor_run(engine: Engine, work: Workload) -> tuple[float, list[dict[str, Any]]]:
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=[p for p, _ in work], sampling_params=[greedy(o) for _, o in work], progress=False)
    return time.perf_counter() - t0, outs


def hf_run(model: Any, work: Workload, batch: int) -> tuple[float, list[list[int]]]:
    """Length-sorted, left-padded batches; each batch generates to its longest output."""
    order = sorted(range(len(work)), key=lambda i: len(work[i][0]))
    outs: list[list[int]] = [[] for _ in work]
    t0 = time.perf_counter()
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        width = max(len(work[i][0]) for i in idx)
        ids = torch.full((len(idx), width), 50256, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):
            p = work[i][0]
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        new = max(work[i][1] for i in idx)
        with torch.no_grad():
            gen = model.generate(
                ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=50256
            )
        for row, i in enumerate(idx):
            outs[i] = gen[row, width : width + work[i][1]].tolist()
    return time.perf_counter() - t0, outs


def best_hf_batch(model: Any, work: Workload, sizes: list[int]) -> tuple[int, dict[int, float]]:
    """The batch size with the highest output tokens/s on `work` (a sample)."""
    rates = {}
    for b in sizes:
        elapsed, _ = hf_run(model, work, b)
        rates[b] = sum(o for _, o in work) / elapsed
    return max(rates, key=rates.__getitem__), rates


# ------------------------------------------------------------- workloads


def run_mixed(engine: Engine, model: Any, n: int, hf_sizes: list[int]) -> dict[str, Any]:
    work = mixed_workload(n)
    tokens = sum(o for _, o in work)
    best, sample_rates = best_hf_batch(model, work[: max(hf_sizes)], hf_sizes)
    hf_s, hf_outs = hf_run(model, work, best)
    arbor_s, outs = arbor_run(engine, work)
    same = sum(o["output_ids"] == h for o, h in zip(outs, hf_outs))
    return {
        "requests": n,
        "output_tokens": tokens,
        "arbor_s": arbor_s,
        "transformers_s": hf_s,
        "transformers_batch": best,
        "transformers_sample_tok_s": sample_rates,
        "arbor_tok_s": tokens / arbor_s,
        "transformers_tok_s": tokens / hf_s,
        "ratio": hf_s / arbor_s,
        "greedy_equal_to_transformers": same,
    }


def optimum_hit_tokens(seqs: list[tuple[list[int], list[int]]]) -> int:
    """Prompt tokens an unbounded cache could serve: each prompt's longest prefix that an
    earlier request computed (its prompt and all but its last output token), <= len - 1."""
    tree = RadixCache(1)
    hit = 0
    for prompt, output in seqs:
        hit += tree.match_prefix(prompt[: len(prompt) - 1]).length
        done = prompt + output[:-1]
        tree.insert(done, list(range(len(done))))
    return hit


def run_fewshot(engines: dict[str, Engine], model: Any, n: int, hf_batch: int) -> dict[str, Any]:
    work = fewshot_workload(n)
    row: dict[str, Any] = {"requests": n, "prefix_tokens": 1500, "output_tokens": sum(o for _, o in work)}
    for name, engine in engines.items():
        engine.flush_cache()
        elapsed, outs = arbor_run(engine, work)
        row[f"{name}_s"] = elapsed
        if name == "cache_on":
            row["hit_tokens"] = sum(o["meta_info"]["cached_tokens"] for o in outs)
            row["optimum_hit_tokens"] = optimum_hit_tokens([(p, o["output_ids"]) for (p, _), o in zip(work, outs)])
    row["transformers_s"], _ = hf_run(model, work, hf_batch)
    return row


def run_multiturn(engines: dict[str, Engine], model: Any, convs: int, turns: int, hf_batch: int) -> dict[str, Any]:
    rng = random.Random(2)
    systems = [[rng.randrange(VOCAB) for _ in range(200)] for _ in range(convs)]
    users = [[[rng.randrange(VOCAB) for _ in range(40)] for _ in range(turns)] for _ in range(convs)]
    row: dict[str, Any] = {"conversations": convs, "turns": turns, "output_tokens": convs * turns * 32}
    for name in [*engines, "transformers"]:
        histories = [list(s) for s in systems]
        seqs: list[tuple[list[int], list[int]]] = []
        hit = 0
        elapsed = 0.0
        if name in engines:
            engines[name].flush_cache()
        for t in range(turns):
            work = [(h + users[c][t], 32) for c, h in enumerate(histories)]
            if name == "transformers":
                dt, outs = hf_run(model, work, hf_batch)
            else:
                dt, res = arbor_run(engines[name], work)
                outs = [r["output_ids"] for r in res]
                hit += sum(r["meta_info"]["cached_tokens"] for r in res)
            elapsed += dt
            for c, ((prompt, _), out) in enumerate(zip(work, outs)):
                seqs.append((prompt, out))
                histories[c] = prompt + out
        row[f"{name}_s"] = elapsed
        if name == "cache_on":
            row["hit_tokens"] = hit
            row["optimum_hit_tokens"] = optimum_hit_tokens(seqs)
    return row


def run_overhead(path: Path, dtype: str, batch: int, steps: int) -> dict[str, Any]:
    """Decode steps of a Scheduler whose forward pass is a no-op returning fixed logits."""
    from arbor.runtime.config import ServerArgs
    from arbor.runtime.io.messages import TokenizedGenerateReq, pack_ids
    from arbor.runtime.model.runner import LogitsOutput
    from arbor.runtime.sampling.params import SamplingParams
    from arbor.runtime.scheduler.scheduler import Scheduler

    args = ServerArgs.from_flags(dtype=dtype, max_running_requests=batch, max_total_tokens=batch * 1024)
    sched = Scheduler(args, str(path))
    vocab = sched.runner.config.vocab_size
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0))
    timers = {"forward": 0.0, "sample": 0.0}

    def noop_forward(fb: Any) -> LogitsOutput:
        t0 = time.perf_counter()
        out = LogitsOutput(next_token_logits=logits[: fb.batch_size])  # a view: no alloc or free
        timers["forward"] += time.perf_counter() - t0
        return out

    real_sampler = sched.sampler

    def timed_sampler(*a: Any) -> torch.Tensor:
        t0 = time.perf_counter()
        out = real_sampler(*a)
        timers["sample"] += time.perf_counter() - t0
        return out

    sched.runner.forward = noop_forward  # type: ignore[method-assign]
    sched.sampler = timed_sampler  # type: ignore[assignment]
    rng = random.Random(3)
    for i in range(batch):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(32, 512))]
        sched.add(
            TokenizedGenerateReq(
                rid=str(i),
                input_ids=pack_ids(prompt),
                sampling=SamplingParams(max_new_tokens=steps + 10, temperature=0, ignore_eos=True),
            )
        )
    while sched.waiting or sched.admission.chunked:
        sched.step()
    assert len(sched.running) == batch
    totals, rest = [], []
    for _ in range(steps):
        timers["forward"] = timers["sample"] = 0.0
        t0 = time.perf_counter()
        sched.step()
        total = time.perf_counter() - t0
        totals.append(total)
        rest.append(total - timers["forward"] - timers["sample"])
        sample_ms = timers["sample"] * 1e3
    return {
        "batch": batch,
        "steps": steps,
        "step_ms_median": statistics.median(totals) * 1e3,
        "overhead_ms_median": statistics.median(rest) * 1e3,
        "overhead_ms_p90": sorted(rest)[int(0.9 * len(rest))] * 1e3,
        "sample_ms_last": sample_ms,
    }


# -------------------------------------------------------------------- peers

PEER_WORKLOADS = ("W1", "W2", "chat")


def run_peers(systems: list[str], repeats: int, hf_sizes: str) -> dict[str, Any]:
    """W1, W2 and the chat replay on every available system, medians of `repeats` runs."""
    import peers

    dtype = peers.dtype_name()
    absent = peers.absent_peers()
    out: dict[str, Any] = {"dtype": dtype, "cpus": os.cpu_count(), "skipped": dict(absent), "systems": {}}
    if "all peers" in absent:
        return out

    def median_of(fn: Any, *a: Any) -> dict[str, float]:
        runs = [fn(*a) for _ in range(repeats)]
        middle = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
        return {**middle, "runs_tok_s": [r["tok_s"] for r in runs]}

    def served(name: str, server: Any, workloads: tuple[str, ...]) -> None:
        with server as system:
            for w in workloads:
                fn = peers.chat_trace if w == "chat" else peers.throughput
                args = (system,) if w == "chat" else (system, peers.w1() if w == "W1" else peers.w2())
                try:
                    out["systems"].setdefault(name, {})[w] = median_of(fn, *args) | {"notes": system.notes}
                except Exception as exc:  # one failing peer run must not lose the others
                    out["skipped"][f"{name} {w}"] = f"failed: {type(exc).__name__}: {exc}"
                    print(f"  {name:24} {w:5} failed: {exc}", flush=True)
                    continue
                print(f"  {name:24} {w:5} {out['systems'][name][w]['tok_s']:8.1f} tok/s", flush=True)

    for name in systems:
        if name in absent:
            continue
        if name == "arbor":
            served("arbor", peers.arbor(dtype), PEER_WORKLOADS)
        elif name == "vllm":
            served("vllm (1 thread, default)", peers.vllm(dtype), PEER_WORKLOADS)
        elif name == "vllm-omp":
            served(f"vllm (OMP_NUM_THREADS={os.cpu_count()})", peers.vllm(dtype, os.cpu_count()), PEER_WORKLOADS)
        elif name == "llama-server":
            for slots, workloads in ((16, ("W1",)), (4, ("W2",)), (8, ("chat",))):
                served("llama-server", peers.llama_server(dtype, slots), workloads)
        elif name == "transformers":
            out["systems"]["transformers"] = run_hf_peer(dtype, repeats, [int(x) for x in hf_sizes.split(",")])
    return out


def run_hf_peer(dtype: str, repeats: int, sizes: list[int]) -> dict[str, Any]:
    """transformers `generate` on W1 and W2 in-process, at its best batch size."""
    import peers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(peers.CKPT, dtype=getattr(torch, dtype)).eval()
    hf_run(model, peers.warmup(), 1)
    res = {}
    for name, work in (("W1", peers.w1()), ("W2", peers.w2())):
        best, _ = best_hf_batch(model, work, sizes)
        tokens = sum(o for _, o in work)
        runs = [tokens / hf_run(model, work, best)[0] for _ in range(repeats)]
        res[name] = {"tok_s": statistics.median(runs), "runs_tok_s": runs, "notes": f"batch {best}"}
        print(f"  {'transformers':24} {name:5} {res[name]['tok_s']:8.1f} tok/s", flush=True)
    return res


def report_peers(p: dict[str, Any]) -> None:
    print(f"\npeers: {p['dtype']} for every system, {p['cpus']} CPUs, output tokens/s (median)")
    for name, why in p["skipped"].items():
        print(f"  skipped {name}: {why}")
    print(f"  {'system':26}" + "".join(f"{w:>10}" for w in PEER_WORKLOADS) + "   Arbor vs best peer")
    best = {
        w: max((v[w]["tok_s"] for k, v in p["systems"].items() if k != "arbor" and w in v), default=0)
        for w in PEER_WORKLOADS
    }
    for name, row in p["systems"].items():
        print(
            f"  {name:26}" + "".join(f"{row[w]['tok_s']:>10.1f}" if w in row else f"{'-':>10}" for w in PEER_WORKLOADS)
        )
    if "arbor" in p["systems"]:
        a = p["systems"]["arbor"]
        print(
            "  Arbor / best peer: "
            + ", ".join(f"{w} {a[w]['tok_s'] / best[w]:.2f}x" for w in PEER_WORKLOADS if w in a and best[w])
        )


def chart_peers(axes: Any, p: dict[str, Any]) -> None:
    names = list(p["systems"])
    for ax, w in zip(axes, PEER_WORKLOADS):
        have = [n for n in names if w in p["systems"][n]]
        ax.bar(
            range(len(have)),
            [p["systems"][n][w]["tok_s"] for n in have],
            color=["C0" if n == "arbor" else "C7" for n in have],
        )
        ax.set_xticks(range(len(have)), [n.replace(" (", "\n(") for n in have], fontsize=7)
        ax.set_title(f"{w} ({p['dtype']}), peer checkpoint")
        ax.set_ylabel("output tokens/s")


# ----------------------------------------------------------------- report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=256, help="requests in the mixed workload")
    ap.add_argument("--fewshot-requests", type=int, default=128)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--hf-batch-sizes", default="16,32,64", help="transformers batch sizes to try")
    ap.add_argument("--max-running", type=int, default=128, help="Arbor's max_running_requests")
    ap.add_argument(
        "--dtype", default="auto", help="auto = bfloat16 where the CPU has fast bf16 (avx512_bf16/AMX), else float32"
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    ap.add_argument(
        "--sections",
        default="peers,cache,overhead",
        help="comma-separated: peers (vs vLLM/llama.cpp/transformers), cache (radix on/off), overhead",
    )
    ap.add_argument(
        "--systems", default="arbor,vllm,vllm-omp,llama-server,transformers", help="systems of the peers section"
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per workload in the peers section (median)")
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    result: dict[str, Any] = json.loads(JSON.read_text()) if JSON.exists() and not args.quick else {}
    if "peers" in sections:
        result["peers"] = run_peers(args.systems.split(","), args.repeats, args.hf_batch_sizes)
        report_peers(result["peers"])
        if not args.quick:
            save(result)
    if not sections & {"cache", "overhead"}:
        return
    if args.quick:
        args.requests, args.fewshot_requests, args.conversations, args.turns = 32, 16, 4, 3
        args.hf_batch_sizes = "8,16"
    from transformers import AutoModelForCausalLM

    from arbor.runtime.model.runner import resolve_dtype

    args.dtype = str(resolve_dtype(args.dtype, torch.device("cpu"))).removeprefix("torch.")
    path = make_tiny_model(Path(tempfile.mkdtemp()) / "medium", SPEC)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    sizes = [int(x) for x in args.hf_batch_sizes.split(",")]
    if "cache" in sections:
        common = {"dtype": args.dtype, "max_running_requests": args.max_running, "max_total_tokens": 300_000}
        with Engine(str(path), **common) as on, Engine(str(path), disable_radix_cache=True, **common) as off:
            arbor_run(on, mixed_workload(8, seed=99))  # warm-up
            arbor_run(off, mixed_workload(8, seed=99))
            mixed = run_mixed(on, model, args.requests, sizes)
            engines = {"cache_on": on, "cache_off": off}
            fewshot = run_fewshot(engines, model, args.fewshot_requests, mixed["transformers_batch"])
            multiturn = run_multiturn(engines, model, args.conversations, args.turns, mixed["transformers_batch"])
        result.update(
            spec={"layers": SPEC.layers, "hidden": SPEC.hidden, "heads": SPEC.heads, "kv_heads": SPEC.kv_heads},
            dtype=args.dtype,
            threads=torch.get_num_threads(),
            quick=args.quick,
            mixed=mixed,
            fewshot=fewshot,
            multiturn=multiturn,
        )
        report(result)
    if "overhead" in sections:
        result["overhead"] = run_overhead(path, args.dtype, 256, 50 if not args.quick else 10)
        report_overhead(result["overhead"])
    if not args.quick:
        save(result)


def save(result: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    JSON.write_text(json.dumps(result, indent=2))
    chart(result)


def report(r: dict[str, Any]) -> None:
    m, f, t = r["mixed"], r["fewshot"], r["multiturn"]
    print(
        f"bench_offline: {r['spec']['layers']} layers, hidden {r['spec']['hidden']}, {r['dtype']}, "
        f"{r['threads']} threads"
    )
    print(f"\n(a) mixed, {m['requests']} requests, {m['output_tokens']} output tokens")
    print(f"  Arbor         {m['arbor_tok_s']:8.1f} tok/s  ({m['arbor_s']:.1f} s)")
    print(
        f"  transformers  {m['transformers_tok_s']:8.1f} tok/s  ({m['transformers_s']:.1f} s, batch "
        f"{m['transformers_batch']})  -> Arbor {m['ratio']:.2f}x"
    )
    print(f"  greedy outputs equal to transformers: {m['greedy_equal_to_transformers']}/{m['requests']}")
    for name, row in (("few-shot", f), ("multi-turn", t)):
        on, off, hf = row["cache_on_s"], row["cache_off_s"], row["transformers_s"]
        print(f"\n(b) {name}: {row['output_tokens']} output tokens")
        print(
            f"  cache on {on:7.1f} s | cache off {off:7.1f} s ({off / on:.2f}x) | transformers {hf:7.1f} s "
            f"({hf / on:.2f}x)"
        )
        print(
            f"  hit tokens {row['hit_tokens']} of optimum {row['optimum_hit_tokens']} "
            f"({row['hit_tokens'] / max(row['optimum_hit_tokens'], 1):.1%})"
        )


def report_overhead(o: dict[str, Any]) -> None:
    print(
        f"\n(c) scheduler overhead per decode step, batch {o['batch']}, no-op model: median "
        f"{o['overhead_ms_median']:.2f} ms (p90 {o['overhead_ms_p90']:.2f}); whole step "
        f"{o['step_ms_median']:.2f} ms incl. sampling ({o['sample_ms_last']:.2f} ms)"
    )


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [k for k in ("peers", "mixed") if k in r]
    fig, grid = plt.subplots(len(rows), 3, figsize=(13, 4 * len(rows)), squeeze=False)
    for axes, key in zip(grid, rows):
        if key == "peers":
            chart_peers(axes, r["peers"])
            continue
        m = r["mixed"]
        axes[0].bar(["Arbor", "transformers"], [m["arbor_tok_s"], m["transformers_tok_s"]], color=["C0", "C1"])
        axes[0].set_title(f"(a) mixed, {m['requests']} requests, tiny Llama")
        axes[0].set_ylabel("output tokens/s")
        for ax, sub, title in ((axes[1], "fewshot", "(b) few-shot"), (axes[2], "multiturn", "(b) multi-turn")):
            row = r[sub]
            ax.bar(
                ["cache on", "cache off", "transformers"],
                [row["output_tokens"] / row[k] for k in ("cache_on_s", "cache_off_s", "transformers_s")],
                color=["C0", "C2", "C1"],
            )
            ax.set_title(title)
            ax.set_ylabel("output tokens/s")
    fig.suptitle("Offline throughput, 2-core CPU")
    fig.tight_layout()
    fig.savefig(OUT / "bench_offline.png", dpi=120)


if __name__ == "__main__":
    main()
