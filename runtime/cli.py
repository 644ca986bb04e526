"""The runtime's commands of `arbor`: serve and make-tiny-model (`arbor/__main__.py` adds demo)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable

from arbor.runtime.config import ServerArgs

Handler = Callable[[argparse.Namespace], int]
STARTUP_FAILURE = 3  # uvicorn's exit code when the app does not start


def add_commands(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    """Register `serve` and `make-tiny-model` on `sub`; return their handlers by name."""
    tiny = sub.add_parser("make-tiny-model", help="write a deterministic random Llama-family checkpoint")
    tiny.add_argument("dir", help="output directory (created)")
    tiny.add_argument(
        "--arch",
        default="llama",
        choices=("llama", "qwen2", "qwen3", "mistral"),
        help="architecture to write (default: llama)",
    )
    tiny.add_argument("--layers", type=int, default=4, help="decoder layers (default: 4)")
    tiny.add_argument("--hidden", type=int, default=128, help="hidden size (default: 128)")
    tiny.add_argument("--heads", type=int, default=4, help="attention heads (default: 4)")
    tiny.add_argument("--kv-heads", type=int, default=2, help="key/value heads, for GQA (default: 2)")
    tiny.add_argument("--seed", type=int, default=0, help="weight seed; equal seeds give equal weights")
    tiny.add_argument("--tie-word-embeddings", action="store_true", help="share embedding and LM head")

    serve = sub.add_parser("serve", help="serve the native and OpenAI-compatible HTTP APIs")
    ServerArgs.add_cli_args(serve)
    return {"make-tiny-model": _make_tiny_model, "serve": _serve}


def setup_logging(log_level: str) -> None:
    """One log format for every command that runs a server."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _make_tiny_model(args: argparse.Namespace) -> int:
    from arbor.runtime.tiny_model import TinySpec, make_tiny_model

    spec = TinySpec(
        arch=args.arch,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        seed=args.seed,
        tie_word_embeddings=args.tie_word_embeddings,
    )
    print(f"wrote {make_tiny_model(args.dir, spec)}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from arbor.runtime.server.app import create_app
    from arbor.runtime.server.connections import uvicorn_config

    server_args = ServerArgs.from_cli_args(args)
    setup_logging(server_args.log_level)
    if server_args.parallel.dp_size > 1:
        from arbor.runtime.data_parallel import serve_data_parallel

        return serve_data_parallel(server_args)
    app = create_app(server_args)
    server = uvicorn.Server(uvicorn_config(app, server_args.http, server_args.log_level))
    state = app.state.arbor
    state.on_engine_death = lambda: setattr(server, "should_exit", True)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it shut down on
        server.run()
    if not server.started:
        return STARTUP_FAILURE  # the log above says why (a bad checkpoint, a port in use, ...)
    if state.manager is not None and state.manager.dead is not None:
        print(f"arbor: error: {state.manager.dead}", file=sys.stderr)
        return 1
    return 0
