"""A live `arbor serve` (tiny checkpoint) as the DSL's default backend."""

from __future__ import annotations

import pytest

import arbor as sgl
from tests.server.conftest import start_server, stop_server

KEY = "dsl-key"


@pytest.fixture(scope="session")
def dsl_server(tiny_model):
    server = start_server(str(tiny_model("llama")), "--api-key", KEY)
    yield server
    stop_server(server)


@pytest.fixture
def backend(dsl_server):
    endpoint = sgl.RuntimeEndpoint(dsl_server.base_url, api_key=KEY)
    sgl.set_default_backend(endpoint)
    return endpoint
