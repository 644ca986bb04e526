"""Speculative decoding on the evaluation pair (`make_eval_models.py`): acceptance and decode
speed, spec off against n-gram guesses and the draft model, at batch 1, 4, 16 and 64.

Prompts are held-out standard-library code prefixes (128 tokens each); generation is greedy,
128 tokens, all requests of a batch at once through the Engine (batch 1: four prompts, one
after another). Each cell reports output tokens/s (median of `--repeats` runs), the mean
tokens committed per verify step, and whether the outputs equal spec-off token for token.
Every system stays up for the whole run and the runs interleave (round r: each batch size on
each system in turn), so this shared machine's slow minutes fall on all systems alike. The
`, always` modes speculate at every batch size (no adaptive switch-off): where they fall below
spec-off is where `--speculative-max-batch` should stop speculation. Peer in the same run:
llama.cpp's `llama-server` on GGUF conversions of the pair (`peers.sh gguf` into
~/.cache/arbor-peers/eval-gguf/{target,draft}), without and with its draft model (`-md`,
K = 4). bf16 where the CPU has fast bf16, else fp32.

    python benchmarks/bench_spec.py            # table; JSON + PNG into docs/benchmarks/
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
BATCHES = (1, 4, 16, 64)
SOLO = 4  # batch 1 runs this many prompts, one at a time
ALWAYS = {"speculative_max_batch": 1024}


def modes(draft: Path, token_map: Path) -> dict[str, dict[str, Any]]:
    """Defaults (K = 4), each also without the batch switch-off, and the draft tuned: K = 6
    with an FR-Spec token map (its 8,192 commonest training tokens)."""
    ngram = {"speculative_algorithm": "ngram"}
    with_draft = {"speculative_algorithm": "draft", "speculative_draft_model_path": str(draft)}
    tuned = with_draft | {"speculative_num_draft_tokens": 6, "speculative_token_map": str(token_map)}
    return {
        "off": {},
        "ngram": ngram,
        "ngram, always": ngram | ALWAYS,
        "draft": with_draft,
        "draft, always": with_draft | ALWAYS,
        "draft K=6, map": tuned,
    }


KV_TOKENS = 32_768  # every engine the same pool: 64 requests x 256 tokens fit, and six engines fit in memory


class ArborSystem:
    """One Arbor Engine kept alive across the run, so its cells interleave with the others'."""

    def __init__(self, stack: contextlib.ExitStack, path: Path, extra: dict[str, Any], out_len: int) -> None:
        from arbor import Engine

        self.params = {"max_new_tokens": out_len, "temperature": 0, "ignore_eos": True}
        self.engine = stack.enter_context(
            Engine(str(path), max_running_requests=max(BATCHES), max_total_tokens=KV_TOKENS, **extra)
        )

    def run(self, prompts: list[list[int]]) -> tuple[float, list[dict[str, Any]]]:
        self.engine.flush_cache()
        t0 = time.perf_counter()
        outs = self.engine.generate(input_ids=prompts, sampling_params=self.params, progress=False)
        return time.perf_counter() - t0, outs


class LlamaSystem:
    """llama-server on GGUF conversions of the pair (`peers.sh gguf`), with `-md` when
    `draft`, K = 4 like Arbor's default; one slot per request of the largest batch."""

    def __init__(self, stack: contextlib.ExitStack, draft: bool, out_len: int) -> None:
        import peers

        gguf = peers.PEERS / "eval-gguf"
        kind = "bf16" if peers.dtype_name() == "bfloat16" else "f32"
        slots = max(BATCHES)
        cmd = [
            str(peers.LLAMA_BIN),
            "-m",
            str(gguf / "target" / f"model-{kind}.gguf"),
            "-t",
            "2",
            "-tb",
            "2",
            "-c",
            str(slots * 512),
            "-np",
            str(slots),
            "-fa",
            "on",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ]
        if draft:
            cmd += [
                "-md",
                str(gguf / "draft" / f"model-{kind}.gguf"),
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                "4",
            ]
        self.system = stack.enter_context(peers.serve("llama-server-md" if draft else "llama-server", cmd))
        self.out_len = out_len

    def run(self, prompts: list[list[int]]) -> tuple[float, None]:
        import peers

        return asyncio.run(peers.run_all(self.system, [(p, self.out_len) for p in prompts])), None


def _groups(prompts: list[list[int]], b: int) -> list[list[list[int]]]:
    """Batch b's workload: the first max(b, SOLO) prompts, b at a time, one batch after another
    (at batch 1, SOLO requests in turn, so one prompt's acceptance does not decide the cell)."""
    return [prompts[i : i + b] for i in range(0, max(b, SOLO), b)]


def measure(
    systems: dict[str, Any], prompts: list[list[int]], out_len: int, repeats: int
) -> dict[str, dict[int, dict[str, Any]]]:
    """Every cell `repeats` times, interleaved: round r runs every batch size on every system
    in turn, so a slow minute on this shared machine lands on all systems alike."""
    for s in systems.values():
        s.run(prompts[:2])  # warm-up
    times: dict[str, dict[int, list[float]]] = {n: {b: [] for b in BATCHES} for n in systems}
    last: dict[str, dict[int, Any]] = {n: {} for n in systems}
    for r in range(repeats):
        for b in BATCHES:
            for name, s in systems.items():
                wall, outs = 0.0, []
                for group in _groups(prompts, b):
                    t, o = s.run(group)
                    wall, outs = wall + t, outs + (o or [])
                last[name][b] = outs
                times[name][b].append(wall)
                tokens = max(b, SOLO) * out_len
                print(f"  round {r + 1}  {name:18} {b:3d} requests  {tokens / wall:8.1f} tok/s", flush=True)
    cells: dict[str, dict[int, dict[str, Any]]] = {}
    for name in systems:
        cells[name] = {}
        for b in BATCHES:
            outs = last[name][b]
            accept = [o["meta_info"].get("spec_accept_len", 1.0) for o in outs] if outs else [float("nan")]
            cells[name][b] = {
                "tok_s": max(b, SOLO) * out_len / statistics.median(times[name][b]),
                "runs_s": times[name][b],
                "accept_len": statistics.mean(accept),
            }
            if outs:
                cells[name][b]["outputs"] = [o["output_ids"] for o in outs]
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
    result: dict[str, Any] = {
        "model": path.name,
        "dtype": str(resolve_dtype("auto", torch.device("cpu"))),
        "prompt_len": args.prompt_len,
        "out_len": args.out_len,
        "modes": {},
    }
    peer_ready = (Path.home() / ".cache" / "arbor-peers" / "eval-gguf" / "draft").exists()
    if not peer_ready:
        print("llama-server skipped: no GGUF conversions of the pair under ~/.cache/arbor-peers/eval-gguf")
    with contextlib.ExitStack() as stack:
        systems: dict[str, Any] = {}
        for name, extra in modes(draft, make_eval_models.token_map(draft)).items():
            systems[name] = ArborSystem(stack, path, extra, args.out_len)
        for name, with_draft in (("llama-server", False), ("llama-server -md", True)) if peer_ready else ():
            systems[name] = LlamaSystem(stack, with_draft, args.out_len)
        result["modes"] = measure(systems, prompts, args.out_len, args.repeats)
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
