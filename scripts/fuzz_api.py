"""Fuzz every route of a live `arbor serve` with schemathesis from its own /openapi.json: no
request may get a 5xx, and the server must be healthy afterwards (KV invariant included).
The suite runs a short profile (tests/server/test_fuzz.py); this script the long one.

    .venv/bin/python scripts/fuzz_api.py [--minutes 10] [--seed N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.conftest import API_KEY, Server, start_server, stop_server  # noqa: E402

# A short context keeps requests without max_tokens (run until the context is full) quick.
SERVER_FLAGS = ("--api-key", API_KEY, "--context-length", "256", "--max-body-bytes", "200000")


def fuzz(server: Server, seconds: int, seed: int | None) -> int:
    """Run schemathesis against `server`; its exit code (0: no server error found)."""
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        f"{server.base_url}/openapi.json",
        "--checks",
        "not_a_server_error",
        "--max-time",
        str(seconds),
        "--workers",
        "2",
        "--request-timeout",
        "60",
        "-H",
        f"Authorization: Bearer {API_KEY}",
        "--no-color",
    ]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    return subprocess.run(cmd, timeout=seconds + 300).returncode


def healthy(server: Server) -> bool:
    """The server answers, its KV invariant holds, and a normal request succeeds."""
    stats = server.request("GET", "/get_server_info")[1]["stats"]
    status, out = server.request("POST", "/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}})
    return stats["invariant_ok"] == 1.0 and status == 200 and out["meta_info"]["completion_tokens"] == 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10, help="fuzzing time (default: 10)")
    parser.add_argument("--seed", type=int, default=None, help="schemathesis seed, to replay a run")
    parser.add_argument("--model-path", default=None, help="checkpoint (default: the built-in tiny one)")
    args = parser.parse_args()
    from arbor.runtime.tiny_model import builtin_model_path

    server = start_server(args.model_path or str(builtin_model_path()), *SERVER_FLAGS)
    try:
        code = fuzz(server, int(args.minutes * 60), args.seed)
        ok = healthy(server)
    finally:
        stop_server(server)
    print(f"schemathesis exit code {code}; server healthy afterwards: {ok}")
    return 0 if code == 0 and ok else 1


if __name__ == "__main__":
    sys.exit(main())
