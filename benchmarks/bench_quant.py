"""Quantized checkpoints of the evaluation target, made by llmcompressor, served by Arbor and
by vLLM's CPU build: held-out perplexity, weight bytes, decode and prefill speed.

The target (`make_eval_models.py`) is quantized once per scheme by `quantize.py` in the
quantizer's own venv (`scripts/quantizer_venv.sh`; ARBOR_QUANTIZER_PYTHON names another) and
cached beside it; the GPTQ-layout row by Intel Neural Compressor (`quantize_gptq.py`,
`scripts/quantizer_venv.sh --gptq`; ARBOR_GPTQ_PYTHON). For each of bf16, W8A16, W4A16-GPTQ,
W8A8-SmoothQuant, FP8, W4A16 in GPTQ's own layout (act-order), and W8A16 / W4A16-GPTQ with the
LM head quantized too (`+ head`: llmcompressor's examples leave the head out, and on this small
model it is most of the bytes a decode step reads):
- perplexity of the held-out windows (`eval_ppl.py`: 64 x 512 tokens, prompt logprobs);
- the bytes of the decoder's linear layers and of the LM head as loaded, and of the whole model;
- greedy decode tok/s at batch 1 and 16 (128-token held-out prompts, 128 new tokens);
- prefill tok/s (16 prompts of 512 tokens, one new token each);
- the KV cache's tokens in 1 GiB (the `bf16, fp8 KV` row stores K and V in float8);
medians of `--repeats` runs; Arbor's engines are all up at once and their runs interleave.
vLLM runs the same checkpoints in the same run, one after another, where it loads them; its
perplexity comes from `prompt_logprobs`. bf16 where the CPU has fast bf16, else fp32.

    python benchmarks/bench_quant.py            # table; JSON + PNG into docs/benchmarks/
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"
PEERS = Path.home() / ".cache" / "arbor-peers"
QUANTIZER = Path(os.environ.get("ARBOR_QUANTIZER_PYTHON", PEERS / "llmcompressor" / "venv" / "bin" / "python"))
GPTQ_QUANTIZER = Path(os.environ.get("ARBOR_GPTQ_PYTHON", PEERS / "gptq" / "venv" / "bin" / "python"))
GPTQ_LAYOUT = "gptq-layout"  # made by quantize_gptq.py (INC), not llmcompressor
HEAD = "-head"  # a scheme name ending so: the LM head quantized too (quantize.py --lm-head)
# name -> (scheme of the checkpoint, KV-cache dtype)
SCHEMES = {
    "bf16": (None, "auto"),
    "W8A16": ("w8a16", "auto"),
    "W4A16-GPTQ": ("w4a16-gptq", "auto"),
    "W8A8-SQ": ("w8a8-sq", "auto"),
    "FP8": ("fp8", "auto"),
    "W4A16, GPTQ layout": (GPTQ_LAYOUT, "auto"),
    "bf16, fp8 KV": (None, "fp8_e4m3"),
    "W8A16 + head": ("w8a16" + HEAD, "auto"),
    "W4A16-GPTQ + head": ("w4a16-gptq" + HEAD, "auto"),
}
KV_TOKENS = 16_384  # every engine the same pool (16 prompts of 512 fit), so all of them fit in memory at once
VLLM_KV = {"auto": "auto", "fp8_e4m3": "fp8"}
VLLM_READY_S = 300  # vLLM's start-up with its compile takes 1-2 minutes here; FP8 weights never got ready


def quantized(target: Path, scheme: str | None) -> Path:
    """The target quantized by `scheme` (made once by the quantizer, then cached)."""
    if scheme is None:
        return target
    out = target.with_name(f"{target.name}-{scheme}")
    if not (out / "config.json").exists():
        gptq = scheme == GPTQ_LAYOUT
        python = GPTQ_QUANTIZER if gptq else QUANTIZER
        if not python.exists():
            raise SystemExit(f"no quantizer at {python}: run scripts/quantizer_venv.sh{' --gptq' if gptq else ''}")
        staging = out.with_name(out.name + ".tmp")
        head = ["--lm-head"] if scheme.endswith(HEAD) else []
        script, args = (
            ("quantize_gptq.py", ["--act-order"])
            if gptq
            else ("quantize.py", ["--scheme", scheme.removesuffix(HEAD), *head])
        )
        subprocess.run(
            [str(python), str(Path(__file__).with_name(script)), str(target), str(staging), *args], check=True
        )
        staging.rename(out)
    return out


def weight_bytes(path: Path, dtype: torch.dtype) -> dict[str, int]:
    """Bytes of the decoder's linear layers (quantized or not), of the LM head (a tied one
    reads the embedding) and of every weight, as Arbor loads them."""
    from torch import nn

    from arbor.runtime.model.layers import LinearLayer
    from arbor.runtime.model.loader import load_model
    from arbor.runtime.model.quant.linear import QuantLinear

    def size(m: nn.Module) -> int:
        return m.weight_bytes() if isinstance(m, QuantLinear) else m.weight.numel() * m.weight.element_size()

    model, _ = load_model(path, dtype, torch.device("cpu"))
    linear = sum(size(m) for name, m in model.named_modules() if isinstance(m, LinearLayer) and name != "lm_head")
    head = size(model.lm_head)
    quant = sum(m.weight_bytes() for m in model.modules() if isinstance(m, QuantLinear))
    dense = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"linear_bytes": linear, "head_bytes": head, "model_bytes": dense + quant}


def kv_tokens_per_gib(path: Path, dtype: str, kv: str) -> int:
    """KV-cache tokens that 1 GiB holds for this model and cache dtype."""
    from arbor.runtime.model.model_config import ModelConfig

    bits = 8 if kv != "auto" else torch.finfo(getattr(torch, dtype)).bits
    return 2**30 // ModelConfig.from_dir(path).kv_bytes_per_token(bits // 8)


def arbor_speed(
    paths: dict[str, tuple[Path, str]], dtype: str, prompts: list[list[int]], long: list[list[int]], repeats: int
) -> dict[str, dict[str, float]]:
    """Decode tok/s at batch 1 and 16 and prefill tok/s of every scheme, {name: (checkpoint,
    KV dtype)}. All the engines stay up and the runs interleave: round r runs each measurement
    on every scheme in turn, so this shared machine's slow minutes land on all schemes alike."""
    from arbor import Engine

    greedy = {"max_new_tokens": 128, "temperature": 0, "ignore_eos": True}
    work = {
        "decode_b1": (prompts[:1], greedy, 128),
        "decode_b16": (prompts[:16], greedy, 16 * 128),
        "prefill": (long, {"max_new_tokens": 1}, sum(len(p) for p in long)),
    }
    times: dict[str, dict[str, list[float]]] = {n: {k: [] for k in work} for n in paths}
    with contextlib.ExitStack() as stack:
        engines = {
            n: stack.enter_context(
                Engine(str(path), dtype=dtype, kv_cache_dtype=kv, max_running_requests=64, max_total_tokens=KV_TOKENS)
            )
            for n, (path, kv) in paths.items()
        }
        for engine in engines.values():
            engine.generate(input_ids=prompts[:2], sampling_params={"max_new_tokens": 8}, progress=False)
        for r in range(repeats):
            for key, (inputs, params, _) in work.items():
                for name, engine in engines.items():
                    engine.flush_cache()
                    t0 = time.perf_counter()
                    engine.generate(input_ids=inputs, sampling_params=params, progress=False)
                    times[name][key].append(time.perf_counter() - t0)
            print(f"  round {r + 1} of {repeats} done", flush=True)
    return {n: {k: work[k][2] / statistics.median(ts) for k, ts in per.items()} for n, per in times.items()}


def vllm_cells(
    path: Path,
    dtype: str,
    kv: str,
    name: str,
    prompts: list[list[int]],
    long: list[list[int]],
    windows: list[list[int]],
    repeats: int,
) -> dict[str, Any]:
    """The same measurements on vLLM's CPU build; {"error": ...} where it does not load the checkpoint."""
    import peers

    if not peers.VLLM_PY.exists():
        return {"error": "no vLLM venv (../shared/tools/peers.sh vllm)"}
    try:
        with peers.vllm(
            dtype,
            model=path,
            name=f"vllm-{name.replace(' ', '').replace(',', '-')}",
            extra=["--kv-cache-dtype", VLLM_KV[kv]],
            timeout=VLLM_READY_S,
        ) as system:
            asyncio.run(peers.run_all(system, peers.warmup()))
            cells: dict[str, Any] = {}
            for b in (1, 16):
                wall = statistics.median(
                    asyncio.run(peers.run_all(system, [(p, 128) for p in prompts[:b]])) for _ in range(repeats)
                )
                cells[f"decode_b{b}"] = b * 128 / wall
            wall = statistics.median(asyncio.run(peers.run_all(system, [(p, 1) for p in long])) for _ in range(repeats))
            cells["prefill"] = sum(len(p) for p in long) / wall
            cells["ppl"] = asyncio.run(_vllm_ppl(system, windows))
            return cells
    except Exception as exc:  # a scheme vLLM's CPU build refuses: report why
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-vllm-{name.replace(' ', '').replace(',', '-')}.log"
        tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
        return {"error": f"{type(exc).__name__}: {exc}; " + " | ".join(tail)[-400:]}


async def _vllm_ppl(system: Any, windows: list[list[int]]) -> float:
    import peers

    total, count = 0.0, 0
    async with peers.client() as c:
        for w in windows:
            r = await c.post(
                f"http://127.0.0.1:{system.port}/v1/completions",
                json={"model": system.model, "prompt": w, "max_tokens": 1, "prompt_logprobs": 0},
            )
            r.raise_for_status()
            entries = r.json()["choices"][0]["prompt_logprobs"][1:]
            for tok, entry in zip(w[1:], entries):
                total -= entry[str(tok)]["logprob"]
                count += 1
    return math.exp(total / count)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--schemes", nargs="*", default=list(SCHEMES), choices=list(SCHEMES))
    ap.add_argument("--no-peer", action="store_true", help="skip vLLM")
    args = ap.parse_args()
    import eval_data
    import eval_ppl
    import make_eval_models
    import peers

    target = make_eval_models.ensure("target")
    dtype = peers.dtype_name()
    windows = eval_data.heldout_windows(target, eval_ppl.WINDOWS, eval_ppl.LENGTH)
    prompts = [w[:128] for w in eval_data.heldout_windows(target, 16, 256)]
    long = eval_data.heldout_windows(target, 16, 512)
    result: dict[str, Any] = {"model": target.name, "dtype": dtype, "schemes": {}}
    paths = {}
    for name in args.schemes:
        scheme, kv = SCHEMES[name]
        path = paths[name] = quantized(target, scheme)
        print(f"{name}: {path}", flush=True)
        result["schemes"][name] = {
            "path": str(path),
            "kv_cache_dtype": kv,
            **weight_bytes(path, getattr(torch, dtype)),
            "kv_tokens_per_gib": kv_tokens_per_gib(path, dtype, kv),
            "ppl": eval_ppl.arbor_ppl(path, windows, dtype=dtype, kv_cache_dtype=kv),
        }
    print("Arbor, every scheme interleaved:", flush=True)
    speed = arbor_speed({n: (paths[n], SCHEMES[n][1]) for n in paths}, dtype, prompts, long, args.repeats)
    for name, cell in result["schemes"].items():
        cell.update(speed[name])
        if not args.no_peer:
            cell["vllm"] = vllm_cells(
                paths[name], dtype, cell["kv_cache_dtype"], name, prompts, long, windows, args.repeats
            )
        print(f"  {_row(name, cell, result['schemes'].get('bf16'))}", flush=True)
    report(result)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_quant.json").write_text(json.dumps(result, indent=2))
    chart(result)


def _row(name: str, c: dict[str, Any], base: dict[str, Any] | None) -> str:
    base = base or c
    rel = lambda k: c[k] / base[k]  # noqa: E731
    return (
        f"{name:12} ppl {c['ppl']:7.3f} ({100 * (c['ppl'] / base['ppl'] - 1):+5.2f}%)  KV/GiB "
        f"{c['kv_tokens_per_gib']:7d}  linear {c['linear_bytes'] / 2**20:6.1f} MiB  head "
        f"{c['head_bytes'] / 2**20:5.1f} MiB  model {c['model_bytes'] / 2**20:6.1f} MiB  decode b1 "
        f"{c['decode_b1']:6.1f} ({rel('decode_b1'):.2f}x)  b16 {c['decode_b16']:7.1f} ({rel('decode_b16'):.2f}x)  "
        f"prefill {c['prefill']:7.1f} ({rel('prefill'):.2f}x)"
    )


def report(r: dict[str, Any]) -> None:
    print(f"\nbench_quant: {r['model']}, activations {r['dtype']}; Arbor (ratios against Arbor bf16)")
    base = r["schemes"].get("bf16")
    for name, cell in r["schemes"].items():
        print("  " + _row(name, cell, base))
    print("vLLM CPU on the same checkpoints (ratios against vLLM bf16):")
    vbase = (base or {}).get("vllm", {})
    for name, cell in r["schemes"].items():
        v = cell.get("vllm")
        if v is None:
            continue
        if "error" in v:
            print(f"  {name:12} not run: {v['error'][:300]}")
        else:
            with_bytes = {
                **v,
                **{k: cell[k] for k in ("linear_bytes", "head_bytes", "model_bytes", "kv_tokens_per_gib")},
            }
            print(
                "  "
                + _row(
                    name,
                    with_bytes,
                    {**vbase, "linear_bytes": 1, "head_bytes": 1, "model_bytes": 1} if "ppl" in vbase else with_bytes,
                )
            )


def chart(r: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["schemes"])
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.6))
    for ax, key, title in zip(
        axes,
        ("ppl", "decode_b1", "decode_b16", "prefill"),
        ("held-out perplexity", "decode tok/s, batch 1", "decode tok/s, batch 16", "prefill tok/s"),
    ):
        arbor = [r["schemes"][n][key] for n in names]
        vllm = [r["schemes"][n].get("vllm", {}).get(key, 0) for n in names]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], arbor, 0.4, label="Arbor")
        ax.bar([x + 0.2 for x in xs], vllm, 0.4, label="vLLM CPU")
        ax.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle(f"quantized eval target, activations {r['dtype']}")
    fig.tight_layout()
    fig.savefig(OUT / "bench_quant.png", dpi=110)


if __name__ == "__main__":
    main()
