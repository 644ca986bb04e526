"""A short schemathesis run over /openapi.json (every route, bodies from the same msgspec
Structs the server decodes): no 5xx, and the server is healthy afterwards. The long run is
scripts/fuzz_api.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from fuzz_api import SERVER_FLAGS, fuzz, healthy

from tests.server.conftest import start_server, stop_server


def test_fuzzing_every_route_finds_no_server_error(tiny_model):
    server = start_server(str(tiny_model("llama")), *SERVER_FLAGS)
    try:
        assert fuzz(server, seconds=45, seed=20261203) == 0
        assert healthy(server)
    finally:
        stop_server(server)
