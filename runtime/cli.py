"""The `arbor` command: serve, demo, make-tiny-model."""

from __future__ import annotations

import argparse
import logging
import sys

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

    demo = sub.add_parser("demo", help="start a server, run an agent program (DSL) and OpenAI-client calls, "
                                       "print outputs, TTFT/TPOT and the cache hit rate, stop")
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
    from frontend_lang.demo import run_demo

    server_args = ServerArgs.from_cli_args(args)
    logging.basicConfig(level=server_args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_demo(server_args)


if __name__ == "__main__":
    sys.exit(main())
