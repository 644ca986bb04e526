"""Train the evaluation pair: a target and a draft Llama that have learned something.

Random checkpoints make acceptance rates and perplexities meaningless, so speculative decoding
and quantization are measured on two small Llama models trained here, on any machine, on the
Python standard library's own sources (`eval_data.py`; 1 file in 20 held out). Both use
GPT-2's tokenizer, so the draft's tokens are the target's.

  target  6 layers, hidden 384, 6 heads / 2 KV heads, tied embeddings (~30M parameters)
  draft   2 layers, hidden 128, 4 heads / 2 KV heads, tied embeddings (~7M parameters)

About 16 minutes on 2 CPU cores: 2,048 tokens a step, about 2.2 s a target step and 1.1 s a
draft step, in bf16 autocast where the CPU has fast bf16 (else fp32). A
seed makes a run reproducible. The checkpoints are cached under ~/.cache/arbor (ARBOR_CACHE)
as ordinary Hugging Face directories, keyed by everything that shapes them, and reused:

    python benchmarks/make_eval_models.py            # train (or find) both, print their paths
    arbor serve --model-path "$(python benchmarks/make_eval_models.py --print target)"

Held-out perplexity of both, next to a unigram baseline, comes from `eval_ppl.py` at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from arbor.runtime.tiny_model import (
    EOS_TOKEN_ID,
    VOCAB_SIZE,
    write_generation_config,
    write_gpt2_tokenizer,
)

CACHE = Path(os.environ.get("ARBOR_CACHE", Path.home() / ".cache" / "arbor"))


@dataclass(frozen=True)
class Recipe:
    """A model shape and how long and how fast it trains."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    steps: int
    lr: float


RECIPES = {
    "target": Recipe(layers=6, hidden=384, heads=6, kv_heads=2, intermediate=1024, steps=300, lr=3e-3),
    "draft": Recipe(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=384, steps=250, lr=5e-3),
}
SEQ_LEN = 256
BATCH = 8
WARMUP = 30
MAX_POSITIONS = 2048


def model_dir(name: str, recipe: Recipe, seed: int) -> Path:
    """Where the trained checkpoint lives: keyed by the recipe, seed, batch and corpus."""
    import eval_data

    blob = json.dumps([asdict(recipe), seed, SEQ_LEN, BATCH, WARMUP, eval_data.corpus_tag()]).encode()
    return CACHE / f"eval-{name}-{hashlib.sha256(blob).hexdigest()[:12]}"


def ensure(name: str, seed: int = 0) -> Path:
    """The trained `name` ("target" or "draft"), trained now if it is not cached yet."""
    recipe = RECIPES[name]
    target = model_dir(name, recipe, seed)
    if (target / "config.json").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=CACHE, prefix=f".eval-{name}-"))
    write_gpt2_tokenizer(staging, MAX_POSITIONS)
    write_generation_config(staging, EOS_TOKEN_ID, EOS_TOKEN_ID)
    train(name, recipe, seed, staging)
    try:
        staging.rename(target)  # atomic: concurrent trainers race safely
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def token_map(model: Path, size: int = 8192) -> Path:
    """`model`'s FR-Spec token map (`--speculative-token-map`): the `size` commonest tokens
    of the training split, written beside the checkpoint on first use."""
    from collections import Counter

    import eval_data

    path = model / f"token_map_{size}.pt"
    if not path.exists():
        counts = Counter(tok for doc in eval_data.tokenize_split(model, held_out=False) for tok in doc)
        ids = torch.tensor(sorted(tok for tok, _ in counts.most_common(size)), dtype=torch.int64)
        staged = path.with_suffix(".tmp")
        torch.save(ids, staged)
        staged.rename(path)
    return path


def train(name: str, recipe: Recipe, seed: int, out: Path) -> None:
    """Train from scratch on the training split and save the model (float32) into `out`."""
    import eval_data
    from transformers import LlamaConfig, LlamaForCausalLM

    from arbor.runtime.model.runner import resolve_dtype

    stream = torch.tensor([t for ids in eval_data.tokenize_split(out, held_out=False) for t in ids], dtype=torch.int64)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=recipe.hidden,
        intermediate_size=recipe.intermediate,
        num_hidden_layers=recipe.layers,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, recipe.steps))
    autocast = resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    gen = torch.Generator().manual_seed(seed)
    log, t0 = [], time.perf_counter()
    bar = tqdm(range(recipe.steps), desc=f"train {name}", unit="step")
    for _step in bar:
        starts = torch.randint(0, stream.numel() - SEQ_LEN, (BATCH,), generator=gen)
        batch = torch.stack([stream[s : s + SEQ_LEN] for s in starts.tolist()])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=batch, labels=batch).loss  # next-token loss (labels shift inside)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        log.append(round(loss.item(), 4))
        bar.set_postfix(loss=f"{sum(log[-20:]) / len(log[-20:]):.3f}")
    model.save_pretrained(out, safe_serialization=True)
    (out / "train_log.json").write_text(
        json.dumps(
            {
                "recipe": asdict(recipe),
                "seed": seed,
                "seq_len": SEQ_LEN,
                "batch": BATCH,
                "bf16_autocast": autocast,
                "train_tokens": int(stream.numel()),
                "seconds": round(time.perf_counter() - t0, 1),
                "loss": log,
            }
        )
    )


def _lr_factor(step: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="seeds the initial weights and the batches")
    ap.add_argument(
        "--print",
        choices=sorted(RECIPES),
        default=None,
        help="print only this model's path (training it first if needed)",
    )
    ap.add_argument(
        "--token-map",
        action="store_true",
        help="with --print draft: print the draft's FR-Spec token map instead (writing it first)",
    )
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out perplexity table")
    args = ap.parse_args()
    if args.print:
        path = ensure(args.print, args.seed)
        print(token_map(path) if args.token_map else path)
        return
    paths = {name: ensure(name, args.seed) for name in RECIPES}
    for name, path in paths.items():
        print(f"{name}: {path}")
    if not args.no_eval:
        import eval_ppl

        eval_ppl.report(eval_ppl.evaluate(list(paths.values()), names=list(paths)))


if __name__ == "__main__":
    main()
