"""ServerArgs round-trips through its CLI flags (the --dp-size supervisor builds each worker's
command line this way), and refuses nonsense sizes."""

from __future__ import annotations

import argparse

import pytest

from arbor.runtime.config import ServerArgs


def _parse(argv: list[str]) -> ServerArgs:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def test_flags_rebuild_the_args_with_overrides():
    args = ServerArgs(model_path="/m", dtype="float32", dp_size=2, enable_mixed_chunk=False, enable_cache_report=True,
                      max_total_tokens=4096, kv_cache_memory_fraction=0.5, router_policy="round_robin")
    argv = args.to_cli_args(dp_size=1, port=31001, num_threads=3)
    assert "--no-enable-mixed-chunk" in argv and "--enable-cache-report" in argv and "--dp-size" not in argv
    rebuilt = _parse(argv)
    assert rebuilt == ServerArgs(model_path="/m", dtype="float32", enable_mixed_chunk=False, enable_cache_report=True,
                                 max_total_tokens=4096, kv_cache_memory_fraction=0.5, router_policy="round_robin",
                                 port=31001, num_threads=3)
    assert ServerArgs().to_cli_args() == []


@pytest.mark.parametrize("bad", [{"dp_size": 0}, {"tp_size": 0}, {"num_threads": 0}])
def test_sizes_below_one_are_refused(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        ServerArgs(**bad)


def test_a_decode_worker_names_its_prefill_peers():
    with pytest.raises(ValueError, match="--disaggregation-prefill-peers"):
        ServerArgs(disaggregation_mode="decode")
    assert ServerArgs(disaggregation_mode="decode", disaggregation_prefill_peers="10.0.0.2:8998")
