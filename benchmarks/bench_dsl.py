"""DSL fork program: 8 branches from a long shared context, radix cache on vs off.

The program (frontend_lang) reads a ~1,000-token context, forks 8 branches that each
generate, joins, and writes a summary. With the cache on, `fork` prefills the context once
and every branch hits it; with `--disable-radix-cache` every branch prefills it again.
Same server binary, same checkpoint, same programs; medians over the programs of a run.
Table on stdout; JSON + PNG into docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import arbor as sgl  # noqa: E402
from arbor.runtime.tiny_model import make_tiny_model  # noqa: E402
from benchmarks.bench_serving import SPEC, start_server, stop_server  # noqa: E402

OUT = ROOT / "docs" / "benchmarks"


@sgl.function
def fork_program(s, context, branches, tokens):
    s += "Context: " + context + "\n"
    forks = s.fork(branches)
    forks += lambda i: f"Question {i}: what does part {i} say?\nAnswer:" + sgl.gen("answer", max_tokens=tokens)
    forks.join()
    s += "Summary of " + str(branches) + " answers:" + sgl.gen("summary", max_tokens=tokens)
    s["forks"] = forks


def run(model: Path, programs: int, branches: int, tokens: int, context_words: int, *flags: str) -> dict[str, Any]:
    proc, port = start_server(model, "--dtype", "float32", *flags)
    try:
        backend = sgl.RuntimeEndpoint(f"http://127.0.0.1:{port}")
        warm = fork_program.run(context="warm up", branches=2, tokens=2, backend=backend, temperature=0)
        warm.text()
        seconds, cached, prompt = [], [], []
        for p in range(programs):
            context = " ".join(f"fact{p}_{i}" for i in range(context_words))
            t0 = time.perf_counter()
            state = fork_program.run(
                context=context, branches=branches, tokens=tokens, backend=backend, temperature=1.0, ignore_eos=True
            )
            seconds.append(time.perf_counter() - t0)
            metas = [f.get_meta_info("answer") for f in state["forks"]]
            cached += [m["cached_tokens"] for m in metas]
            prompt += [m["prompt_tokens"] for m in metas]
        return {
            "seconds_median": statistics.median(seconds),
            "seconds": seconds,
            "branch_cached_min": min(cached),
            "branch_prompt_median": statistics.median(prompt),
        }
    finally:
        stop_server(proc)


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    names = ["cache on", "cache off"]
    ax.bar(names, [r["cache_on"]["seconds_median"], r["cache_off"]["seconds_median"]], color=["#2a7", "#aaa"])
    ax.set_ylabel("seconds per program (median)")
    ax.set_title(f"fork({r['branches']}) from a {r['cache_on']['branch_prompt_median']:.0f}-token prompt")
    fig.tight_layout()
    fig.savefig(OUT / "bench_dsl.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=5, help="programs per run (different contexts)")
    parser.add_argument("--branches", type=int, default=8, help="fork width")
    parser.add_argument("--tokens", type=int, default=16, help="tokens each branch and the summary generate")
    parser.add_argument("--context-words", type=int, default=500, help="words of shared context (~2 tokens each)")
    args = parser.parse_args()
    model = Path(tempfile.gettempdir()) / "arbor-bench-model"
    if not (model / "config.json").exists():
        make_tiny_model(model, SPEC)
    base = (args.programs, args.branches, args.tokens, args.context_words)
    result: dict[str, Any] = {
        "branches": args.branches,
        "tokens": args.tokens,
        "cache_on": run(model, *base),
        "cache_off": run(model, *base, "--disable-radix-cache"),
    }
    on, off = result["cache_on"], result["cache_off"]
    result["speedup"] = off["seconds_median"] / on["seconds_median"]
    print(f"{'run':<10}{'s/program':>10}{'branch prompt':>15}{'min cached/branch':>19}")
    for name in ("cache_on", "cache_off"):
        r = result[name]
        print(f"{name:<10}{r['seconds_median']:>10.2f}{r['branch_prompt_median']:>15.0f}{r['branch_cached_min']:>19}")
    print(f"cache on vs off: {result['speedup']:.2f}x faster per program")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_dsl.json").write_text(json.dumps(result, indent=1))
    chart(result)


if __name__ == "__main__":
    main()
