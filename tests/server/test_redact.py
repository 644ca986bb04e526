"""Error messages a client reads carry no filesystem path of the server."""

from __future__ import annotations

import sys
from pathlib import Path

from arbor.runtime.server.errors import ApiError
from arbor.runtime.server.redact import hide, public


def test_known_directories_read_as_labels_and_source_files_as_names():
    hide("/srv/models/llama-3", "llama-3")
    text = (
        "FileNotFoundError: /srv/models/llama-3/model.safetensors; RuntimeError at "
        f"{Path(__file__).resolve().parents[2]}/kernels/cpu_ops.cpp:120; {sys.prefix}/lib/site.py"
    )
    assert public(text) == "FileNotFoundError: llama-3/model.safetensors; RuntimeError at cpu_ops.cpp:120; site.py"


def test_a_directory_is_hidden_only_whole_and_other_text_is_kept():
    hide("/srv/models/qwen", "qwen")
    assert public("/srv/models/qwen2 and /srv/models/qwen") == "/srv/models/qwen2 and qwen"
    assert public("regex '^/api/v[0-9]+$' is invalid") == "regex '^/api/v[0-9]+$' is invalid"


def test_every_api_error_body_goes_through_it():
    hide("/srv/models/mistral", "mistral")
    body = ApiError(503, "the scheduler failed: /srv/models/mistral/config.json").body()
    assert body["error"]["message"] == "the scheduler failed: mistral/config.json"
