"""Decode tokens/s of Arbor's Engine vs transformers `generate`, same checkpoint and dtype.

Decode rate = batch * (N - 1) / (time(N new tokens) - time(1 new token)), measured the same
way for both, so prefill cost cancels. Median of repeats. Table on stdout; JSON + PNG into
docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from arbor.runtime.engine import Engine
from arbor.runtime.tiny_model import TinySpec, make_tiny_model

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _decode_rate(run, batch: int, new: int, repeats: int) -> float:
    run(1)  # warm-up
    rates = []
    for _ in range(repeats):
        rates.append(batch * (new - 1) / (_timed(lambda: run(new)) - _timed(lambda: run(1))))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    spec = TinySpec(arch="llama", layers=8, hidden=512, heads=8, kv_heads=4)
    path = make_tiny_model(Path(tempfile.mkdtemp()) / "medium", spec)
    dtype = getattr(torch, args.dtype)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    rows = []
    with Engine(str(path), dtype=args.dtype, max_running_requests=64) as engine:
        for b in [int(x) for x in args.batches.split(",")]:
            ids = torch.randint(0, 50257, (b, args.prompt_len), generator=torch.Generator().manual_seed(b))

            def arbor(n: int, ids=ids) -> None:
                engine.generate(
                    input_ids=ids.tolist(), sampling_params={"max_new_tokens": n, "temperature": 0, "ignore_eos": True}
                )

            def reference(n: int, ids=ids) -> None:
                with torch.no_grad():
                    hf.generate(
                        ids,
                        max_new_tokens=n,
                        min_new_tokens=n,
                        do_sample=False,
                        pad_token_id=50256,
                        attention_mask=torch.ones_like(ids),
                    )

            ours = _decode_rate(arbor, b, args.new_tokens, args.repeats)
            theirs = _decode_rate(reference, b, args.new_tokens, args.repeats)
            rows.append({"batch": b, "arbor_tok_s": ours, "transformers_tok_s": theirs, "ratio": ours / theirs})
    print(
        f"decode tokens/s, {spec.layers} layers, hidden {spec.hidden}, {args.dtype}, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens, median of {args.repeats}"
    )
    print(f"{'batch':>6} {'arbor':>10} {'transformers':>13} {'ratio':>7}")
    for r in rows:
        print(f"{r['batch']:>6} {r['arbor_tok_s']:>10.1f} {r['transformers_tok_s']:>13.1f} {r['ratio']:>6.2f}x")
    OUT.mkdir(parents=True, exist_ok=True)
    meta = {
        "spec": {"layers": spec.layers, "hidden": spec.hidden, "heads": spec.heads, "kv_heads": spec.kv_heads},
        "dtype": args.dtype,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    (OUT / "bench_forward.json").write_text(json.dumps(meta, indent=2))
    _chart(rows)


def _chart(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [str(r["batch"]) for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([i - 0.2 for i in x], [r["arbor_tok_s"] for r in rows], 0.4, label="Arbor")
    ax.bar([i + 0.2 for i in x], [r["transformers_tok_s"] for r in rows], 0.4, label="transformers generate")
    ax.set_xticks(list(x), labels)
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Decode throughput, medium tiny Llama (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "bench_forward.png", dpi=120)


if __name__ == "__main__":
    main()
