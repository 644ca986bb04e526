"""Speculative decoding on the evaluation pair (`make_eval_models.py`): acceptance and decode
speed, spec off against n-gram guesses and the draft model, at batch 1, 4, 16 and 64.

Prompts are held-out standard-library code prefixes (128 tokens each); generation is greedy,
128 tokens, all requests at once through the Engine. Each cell reports output tokens/s
(median of `--repeats` runs), the mean tokens committed per verify step, and whether the
outputs equal spec-off token for token. The `, always` modes speculate at every batch size
(no adaptive switch-off): where they fall below spec-off is where `--speculative-max-batch`
should stop speculation. Peer in the same run: llama.cpp's `llama-server` on GGUF conversions
of the pair (`peers.sh gguf` into ~/.cache/arbor-peers/eval-gguf/{target,draft}), without and
with its draft model (`-md`, K = 4). bf16 where the CPU has fast bf16, else fp32.

    python benchmarks/bench_spec.py            # table; JSON + PNG into docs/benchmarks/
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
BATCHES = (1, 4, 16, 64)
ALWAYS = {"speculative_max_batch": 1024}


def modes(draft: Path, token_map: Path) -> dict[str, dict[str, Any]]:
    """Defaults (K = 4), each also without the batch switch-off, and the draft tuned: K = 6
    with an FR-Spec token map (its 8,192 commonest training tokens)."""
    ngram = {"speculative_algorithm": "ngram"}
    with_draft = {"speculative_algorithm": "draft", "speculative_draft_model_path": str(draft)}
    tuned = with_draft | {"speculative_num_draft_tokens": 6, "speculative_token_map": str(token_map)}
    return {"off": {}, "ngram": ngram, "ngram, always": ngram | ALWAYS, "draft": with_draft,
            "draft, always": with_draft | ALWAYS, "draft K=6, map": tuned}


def run_mode(path: Path, prompts: list[list[int]], extra: dict[str, Any], out_len: int, repeats: int
             ) -> dict[int, dict[str, Any]]:
    from arbor import Engine

    params = {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True}
    cells = {}
    with Engine(str(path), max_running_requests=max(BATCHES), **extra) as engine:
        engine.generate(input_ids=prompts[:2], sampling_params=params, progress=False)  # warm-up
        for b in BATCHES:
            times, outs = [], []
            for _ in range(repeats):
                engine.flush_cache()
                t0 = time.perf_counter()
                outs = engine.generate(input_ids=prompts[:b], sampling_params=params, progress=False)
                times.append(time.perf_counter() - t0)
            accept = [o["meta_info"].get("spec_accept_len", 1.0) for o in outs]
            cells[b] = {"tok_s": b * out_len / statistics.median(times), "runs_s": times,
                        "accept_len": statistics.mean(accept), "outputs": [o["output_ids"] for o in outs]}
            print(f"  {b:3d} requests  {cells[b]['tok_s']:8.1f} tok/s  accept {cells[b]['accept_len']:.2f}", flush=True)
    return cells


def run_llama(prompts: list[list[int]], out_len: int, repeats: int, draft: bool) -> dict[int, dict[str, Any]]:
    """llama-server on GGUF conversions of the pair (`peers.sh gguf`), with `-md` when `draft`,
    K = 4 like Arbor's default; one slot per request of the largest batch."""
    import asyncio

    import peers

    gguf = peers.PEERS / "eval-gguf"
    kind = "bf16" if peers.dtype_name() == "bfloat16" else "f32"
    slots = max(BATCHES)
    cmd = [str(peers.LLAMA_BIN), "-m", str(gguf / "target" / f"model-{kind}.gguf"), "-t", "2", "-tb", "2",
           "-c", str(slots * 512), "-np", str(slots), "-fa", "on", "--host", "127.0.0.1", "--port", "{port}"]
    if draft:
        cmd += ["-md", str(gguf / "draft" / f"model-{kind}.gguf"), "--spec-type", "draft-simple",
                "--spec-draft-n-max", "4"]
    cells = {}
    with peers.serve("llama-server-md" if draft else "llama-server", cmd) as system:
        asyncio.run(peers.run_all(system, [(prompts[0], 8)]))  # warm-up
        for b in BATCHES:
            times = [asyncio.run(peers.run_all(system, [(p, out_len) for p in prompts[:b]])) for _ in range(repeats)]
            cells[b] = {"tok_s": b * out_len / statistics.median(times), "runs_s": times, "accept_len": float("nan")}
            print(f"  {b:3d} requests  {cells[b]['tok_s']:8.1f} tok/s", flush=True)
    return cells


def main() -> None:
    import eval_data
    import make_eval_models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from arbor.runtime.model.runner import resolve_dtype

    path, draft = make_eval_models.ensure("target"), make_eval_models.ensure("draft")
    prompts = eval_data.heldout_windows(path, max(BATCHES), args.prompt_len)
    result: dict[str, Any] = {"model": path.name, "dtype": str(resolve_dtype("auto", torch.device("cpu"))),
                              "prompt_len": args.prompt_len, "out_len": args.out_len, "modes": {}}
    for name, extra in modes(draft, make_eval_models.token_map(draft)).items():
        print(f"{name}:", flush=True)
        result["modes"][name] = run_mode(path, prompts, extra, args.out_len, args.repeats)
    peer_ready = (Path.home() / ".cache" / "arbor-peers" / "eval-gguf" / "draft").exists()
    for name, with_draft in (("llama-server", False), ("llama-server -md", True)) if peer_ready else ():
        print(f"{name}:", flush=True)
        result["modes"][name] = run_llama(prompts, args.out_len, args.repeats, with_draft)
    if not peer_ready:
        print("llama-server skipped: no GGUF conversions of the pair under ~/.cache/arbor-peers/eval-gguf")
    base = result["modes"]["off"]
    base_outputs = {b: cell["outputs"] for b, cell in base.items()}
    for name, cells in result["modes"].items():
        own = result["modes"]["llama-server"] if name.startswith("llama") else base  # each system's own spec-off
        for b, cell in cells.items():
            cell["speedup"] = cell["tok_s"] / own[b]["tok_s"]
            if "outputs" in cell:
                cell["equal_to_off"] = cell.pop("outputs") == base_outputs[b]
    report(result)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_spec.json").write_text(json.dumps(result, indent=2))
    chart(result)


def report(r: dict[str, Any]) -> None:
    print(f"\nbench_spec: {r['model']}, {r['dtype']}, prompts {r['prompt_len']}, greedy {r['out_len']} tokens")
    print(f"  {'mode':14} " + " ".join(f"{'b=' + str(b):>22}" for b in BATCHES))
    for name, cells in r["modes"].items():
        row = " ".join(f"{c['tok_s']:8.1f} ({c['speedup']:.2f}x, {c['accept_len']:.2f})" for c in cells.values())
        print(f"  {name:14} {row}")
    print("  cells: tok/s (speedup over the same system's spec off, tokens per verify step; nan: not reported)")


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, cells in r["modes"].items():
        a.plot(list(BATCHES), [cells[x]["tok_s"] for x in BATCHES], marker="o", label=name)
        b.plot(list(BATCHES), [cells[x]["speedup"] for x in BATCHES], marker="o", label=name)
    for ax, title in ((a, "output tokens/s"), (b, "speed-up over spec off")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests at once")
        ax.set_title(title)
        ax.legend()
    b.axhline(1.0, color="grey", lw=0.8)
    fig.suptitle(f"speculative decoding, eval target, {r['dtype']}")
    fig.tight_layout()
    fig.savefig(OUT / "bench_spec.png", dpi=110)


if __name__ == "__main__":
    main()
