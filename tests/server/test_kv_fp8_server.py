"""`arbor serve --kv-cache-dtype fp8_e4m3`: /get_server_info reports the float8 cache and its
doubled token capacity, and requests run on it."""

from __future__ import annotations

from tests.server.conftest import start_server, stop_server


def test_server_info_reports_the_float8_cache(tiny_model) -> None:
    path = str(tiny_model("llama"))
    infos = {}
    for kv in ("auto", "fp8_e4m3"):
        # A budget in bytes (what a fraction of memory would be), so the capacities compare.
        server = start_server(
            path, "--kv-cache-dtype", kv, "--kv-cache-memory-fraction", "0.001", "--max-running-requests", "4096"
        )
        try:
            status, out = server.request(
                "POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 4}}
            )
            assert status == 200 and out["meta_info"]["completion_tokens"] == 4
            infos[kv] = server.request("GET", "/get_server_info")[1]
        finally:
            stop_server(server)
    assert infos["auto"]["kv_cache_dtype"] == "float32"
    assert infos["fp8_e4m3"]["kv_cache_dtype"] == "float8_e4m3fn"
    ratio = infos["fp8_e4m3"]["max_total_num_tokens"] / infos["auto"]["max_total_num_tokens"]
    assert 3.5 < ratio < 4.5  # float32 -> float8: a quarter of the bytes a token (bf16 -> float8: half)
