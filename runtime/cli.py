"""The `arbor` command: serve, demo, make-tiny-model."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from runtime.config import ServerArgs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arbor", description="Arbor: a prefix-sharing LLM runtime.")
    sub = parser.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser("make-tiny-model", help="write a deterministic random Llama-family checkpoint")
    tiny.add_argument("dir", help="output directory (created)")
    tiny.add_argument("--arch", default="llama", choices=("llama", "qwen2", "qwen3", "mistral"),
                      help="architecture to write (default: llama)")
    tiny.add_argument("--layers", type=int, default=4, help="decoder layers (default: 4)")
    tiny.add_argument("--hidden", type=int, default=128, help="hidden size (default: 128)")
    tiny.add_argument("--heads", type=int, default=4, help="attention heads (default: 4)")
    tiny.add_argument("--kv-heads", type=int, default=2, help="key/value heads, for GQA (default: 2)")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed; equal seeds give equal weights")
    tiny.add_argument("--tie-word-embeddings", action="store_true", help="share embedding and LM head")

    demo = sub.add_parser("demo", help="greedily generate from a prompt and report tokens/s")
    demo.add_argument("--prompt", default="The radix tree shares prefixes, so", help="prompt text")
    demo.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default: 64)")
    ServerArgs.add_cli_args(demo)

    serve = sub.add_parser("serve", help="serve the native and OpenAI-compatible HTTP APIs")
    ServerArgs.add_cli_args(serve)

    args = parser.parse_args(argv)
    try:
        if args.command == "make-tiny-model":
            return _make_tiny_model(args)
        if args.command == "serve":
            return _serve(args)
        return _demo(args)
    except ValueError as e:  # user-fixable problems: one line, no traceback
        print(f"arbor: error: {e}", file=sys.stderr)
        return 2


def _make_tiny_model(args: argparse.Namespace) -> int:
    from runtime.tiny_model import TinySpec, make_tiny_model

    spec = TinySpec(
        arch=args.arch, layers=args.layers, hidden=args.hidden, heads=args.heads,
        kv_heads=args.kv_heads, seed=args.seed, tie_word_embeddings=args.tie_word_embeddings,
    )
    print(f"wrote {make_tiny_model(args.dir, spec)}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from runtime.server.app import create_app

    server_args = ServerArgs.from_cli_args(args)
    logging.basicConfig(level=server_args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(server_args)
    uvicorn.run(app, host=server_args.host, port=server_args.port, log_level=server_args.log_level,
                timeout_graceful_shutdown=5)
    return 0


def _demo(args: argparse.Namespace) -> int:
    server_args = ServerArgs.from_cli_args(args)
    logging.basicConfig(level=server_args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from runtime.engine import Engine

    kwargs = {k: v for k, v in vars(server_args).items() if k != "model_path"}
    with Engine(server_args.model_path, **kwargs) as engine:
        params = {"max_new_tokens": args.max_new_tokens, "temperature": 0, "ignore_eos": True}
        engine.generate(args.prompt, sampling_params={"max_new_tokens": 2})  # warm-up
        t0 = time.perf_counter()
        out = engine.generate(args.prompt, sampling_params=params)
        elapsed = time.perf_counter() - t0
    n = out["meta_info"]["completion_tokens"]
    print(f"model:  {engine.model_path}")
    print(f"prompt: {args.prompt!r}")
    print(f"output: {out['text']!r}")
    print(f"tokens: {out['output_ids'][:16]}{' ...' if n > 16 else ''}")
    print(f"{n} tokens in {elapsed:.2f} s: {n / elapsed:.1f} tokens/s (greedy, batch 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
