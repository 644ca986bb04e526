"""Held-out perplexity through Arbor's own prompt logprobs: the accuracy yardstick for the
evaluation models (`make_eval_models.py`) and for anything that changes numerics
(quantization, KV-cache dtypes).

Each window of held-out standard-library tokens goes through `Engine.generate` with
`max_new_tokens=0` and `logprob_start_len=0`; perplexity is exp(mean negative logprob) over
every token but each window's first. A unigram model of the training split (add-one
smoothing) is the baseline a model must beat; `--check-hf` adds transformers' own number for
the same windows, as an oracle of the logprob path.

    python benchmarks/eval_ppl.py --model-path DIR [DIR ...] [--dtype bfloat16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import torch

WINDOWS = 64
LENGTH = 512


def arbor_ppl(model_path: Path, windows: list[list[int]], dtype: str = "auto", **engine_args: Any) -> float:
    """Perplexity of `windows` under the model, from Arbor's prompt logprobs."""
    from arbor import Engine

    with Engine(str(model_path), dtype=dtype, **engine_args) as engine:
        outs = engine.generate(
            input_ids=windows,
            sampling_params={"max_new_tokens": 0},
            return_logprob=True,
            logprob_start_len=0,
            progress=False,
        )
    logprobs = [e[0] for out in outs for e in out["meta_info"]["input_token_logprobs"][1:]]
    assert len(logprobs) == sum(len(w) - 1 for w in windows), "a logprob for every token but the first"
    return math.exp(-sum(logprobs) / len(logprobs))


def hf_ppl(model_path: Path, windows: list[list[int]], dtype: str = "float32") -> float:
    """The same perplexity from transformers, window by window."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for w in windows:
            ids = torch.tensor([w])
            total += model(input_ids=ids, labels=ids).loss.item() * (len(w) - 1)
            count += len(w) - 1
    return math.exp(total / count)


def unigram_ppl(tokenizer_dir: Path, windows: list[list[int]], vocab: int) -> float:
    """Perplexity of a unigram model of the training split, add-one smoothed."""
    import eval_data

    counts = Counter(t for ids in eval_data.tokenize_split(tokenizer_dir, held_out=False) for t in ids)
    total = sum(counts.values()) + vocab
    nll = [-math.log((counts[t] + 1) / total) for w in windows for t in w[1:]]
    return math.exp(sum(nll) / len(nll))


def evaluate(
    paths: list[Path],
    names: list[str] | None = None,
    dtype: str = "auto",
    check_hf: bool = False,
    windows: int = WINDOWS,
    length: int = LENGTH,
) -> dict[str, Any]:
    """Perplexities of every model and the unigram baseline on the same held-out windows."""
    import eval_data
    from transformers import AutoConfig

    from arbor.runtime.model.runner import resolve_dtype

    names = names or [p.name for p in paths]
    ws = eval_data.heldout_windows(paths[0], windows, length)
    vocab = AutoConfig.from_pretrained(paths[0]).vocab_size
    dtype_name = str(resolve_dtype(dtype, torch.device("cpu"))).removeprefix("torch.")
    result: dict[str, Any] = {
        "windows": windows,
        "length": length,
        "dtype": dtype_name,
        "corpus": eval_data.corpus_tag(),
        "unigram": unigram_ppl(paths[0], ws, vocab),
        "models": {},
    }
    for name, path in zip(names, paths):
        row = {"path": str(path), "arbor": arbor_ppl(path, ws, dtype)}
        if check_hf:
            row["transformers_fp32"] = hf_ppl(path, ws)
        result["models"][name] = row
    return result


def report(result: dict[str, Any]) -> None:
    print(
        f"\nheld-out perplexity: {result['windows']} windows x {result['length']} tokens of the "
        f"{result['corpus']} standard library, Arbor in {result['dtype']}"
    )
    print(f"  {'model':10} {'Arbor':>10} {'transformers fp32':>18}")
    for name, row in result["models"].items():
        hf = f"{row['transformers_fp32']:.2f}" if "transformers_fp32" in row else "-"
        print(f"  {name:10} {row['arbor']:10.2f} {hf:>18}")
    print(f"  {'unigram':10} {result['unigram']:10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", nargs="+", required=True, type=Path, help="checkpoints to evaluate")
    ap.add_argument("--dtype", default="auto", help="Arbor's dtype (auto: bfloat16 where the CPU has fast bf16)")
    ap.add_argument("--windows", type=int, default=WINDOWS, help="held-out windows")
    ap.add_argument("--length", type=int, default=LENGTH, help="tokens per window")
    ap.add_argument("--check-hf", action="store_true", help="also compute transformers' fp32 perplexity")
    ap.add_argument("--json", type=Path, default=None, help="write the result here")
    args = ap.parse_args()
    result = evaluate(
        args.model_path, dtype=args.dtype, check_hf=args.check_hf, windows=args.windows, length=args.length
    )
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
