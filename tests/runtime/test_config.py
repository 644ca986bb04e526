"""ServerArgs round-trips through its CLI flags (the --dp-size supervisor builds each worker's
command line this way) and through JSON (a child process's spec); each section refuses nonsense
on its own, and the flags stay the ones `arbor serve` always had."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import msgspec
import pytest

from arbor.runtime.config import (
    CacheArgs,
    DisaggArgs,
    GrammarArgs,
    HttpArgs,
    ModelArgs,
    ParallelArgs,
    RouterArgs,
    SchedulerArgs,
    ServerArgs,
    SpecArgs,
)
from arbor.runtime.io.processes import ChildSpec

# Every flag `arbor serve` takes (SGLang's names); a section may rename its field, never the flag.
FLAGS = {
    "model_path",
    "tokenizer_path",
    "load_format",
    "dtype",
    "device",
    "page_size",
    "max_running_requests",
    "max_total_tokens",
    "kv_cache_dtype",
    "kv_cache_memory_fraction",
    "context_length",
    "attention_backend",
    "chunked_prefill_size",
    "enable_mixed_chunk",
    "max_prefill_tokens",
    "schedule_policy",
    "schedule_max_skips",
    "disable_radix_cache",
    "random_seed",
    "host",
    "port",
    "metrics_port",
    "api_key",
    "api_key_file",
    "admin_api_key_file",
    "enable_cache_report",
    "incremental_streaming_output",
    "served_model_name",
    "max_body_bytes",
    "max_n",
    "max_batch_prompts",
    "max_concurrent_requests",
    "max_connections",
    "header_timeout_s",
    "body_timeout_s",
    "body_deadline_s",
    "keep_alive_timeout_s",
    "health_heartbeat_timeout_s",
    "grammar_backend",
    "grammar_workers",
    "grammar_compile_timeout_s",
    "grammar_max_memory_mb",
    "grammar_max_pending",
    "grammar_max_mask_ms",
    "grammar_cache_mb",
    "grammar_cache_dir",
    "tool_call_parser",
    "reasoning_parser",
    "disable_jump_forward",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_token_map",
    "speculative_num_draft_tokens",
    "speculative_ngram_min_match",
    "speculative_ngram_max_match",
    "speculative_max_batch",
    "tp_size",
    "dp_size",
    "router_policy",
    "router_cache_threshold",
    "router_balance_abs_threshold",
    "router_balance_rel_threshold",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
    "disaggregation_secret_file",
    "disaggregation_prefill_peers",
    "disaggregation_staging_mb",
    "disaggregation_allowed_peers",
    "disaggregation_ib_device",
    "disaggregation_timeout_s",
    "num_threads",
    "log_level",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def _parse(argv: list[str]) -> ServerArgs:
    return ServerArgs.from_cli_args(_parser().parse_args(argv))


def test_flags_rebuild_the_args_with_overrides():
    args = ServerArgs.from_flags(
        model_path="/m",
        dtype="float32",
        dp_size=2,
        enable_mixed_chunk=False,
        enable_cache_report=True,
        max_total_tokens=4096,
        kv_cache_memory_fraction=0.5,
        router_policy="round_robin",
    )
    argv = args.to_cli_args(dp_size=1, port=31001, num_threads=3)
    assert "--no-enable-mixed-chunk" in argv and "--enable-cache-report" in argv and "--dp-size" not in argv
    rebuilt = _parse(argv)
    assert rebuilt == ServerArgs.from_flags(
        model_path="/m",
        dtype="float32",
        enable_mixed_chunk=False,
        enable_cache_report=True,
        max_total_tokens=4096,
        kv_cache_memory_fraction=0.5,
        router_policy="round_robin",
        port=31001,
        num_threads=3,
    )
    assert ServerArgs().to_cli_args() == []


def test_flags_land_in_their_sections():
    args = ServerArgs.from_flags(
        model_path="/m",
        kv_cache_dtype="fp8",
        schedule_policy="fcfs",
        tp_size=2,
        speculative_algorithm="ngram",
        grammar_backend="xgrammar",
        port=31001,
        disaggregation_bootstrap_port=9000,
        router_cache_threshold=0.5,
    )
    assert (args.model.path, args.cache.dtype, args.scheduler.policy, args.parallel.tp_size) == ("/m", "fp8", "fcfs", 2)
    assert (args.spec.algorithm, args.grammar.backend, args.http.port) == ("ngram", "xgrammar", 31001)
    assert (args.disagg.bootstrap_port, args.router.cache_threshold) == (9000, 0.5)
    with pytest.raises(TypeError, match="no flag mem_fraction_static"):
        ServerArgs.from_flags(mem_fraction_static=0.8)


def test_the_cli_flags_are_unchanged():
    actions = [a for a in _parser()._actions if a.dest != "help"]
    assert {a.dest for a in actions} == FLAGS
    assert all(a.option_strings == ["--" + a.dest.replace("_", "-")] or a.dest == "enable_mixed_chunk" for a in actions)
    assert all(a.help for a in actions)
    by_dest = {a.dest: a for a in actions}
    assert by_dest["enable_mixed_chunk"].option_strings == ["--enable-mixed-chunk", "--no-enable-mixed-chunk"]
    assert by_dest["kv_cache_dtype"].choices == ("auto", "fp8_e4m3", "fp8")
    assert by_dest["max_body_bytes"].default == 4 << 20 and by_dest["max_body_bytes"].type is int
    assert by_dest["tool_call_parser"].default is None
    assert by_dest["load_format"].choices == ("auto", "safetensors")


def test_choices_are_literal_types():
    """Every flag with choices gets them from a Literal type, except --load-format, whose
    choices are the weight-source registry's."""
    sections = (
        ServerArgs,
        ModelArgs,
        CacheArgs,
        SchedulerArgs,
        ParallelArgs,
        SpecArgs,
        GrammarArgs,
        HttpArgs,
        DisaggArgs,
        RouterArgs,
    )
    fields = {f.metadata.get("flag") or f.name: (s, f) for s in sections for f in dataclasses.fields(s)}
    for action in _parser()._actions:
        if not action.choices:
            continue
        section, f = fields[action.dest]
        if action.dest == "load_format":
            assert f.metadata["choices"] == action.choices
            continue
        hint = typing.get_type_hints(section)[f.name]
        literal = next(a for a in (hint, *typing.get_args(hint)) if typing.get_origin(a) is typing.Literal)
        assert typing.get_args(literal) == action.choices


@pytest.mark.parametrize("bad", [{"dp_size": 0}, {"tp_size": 0}, {"num_threads": 0}])
def test_sizes_below_one_are_refused(bad):
    with pytest.raises(ValueError, match="must be >= 1"):
        ServerArgs.from_flags(**bad)


def test_a_decode_worker_names_its_prefill_peers():
    with pytest.raises(ValueError, match="--disaggregation-prefill-peers"):
        ServerArgs.from_flags(disaggregation_mode="decode")
    assert ServerArgs.from_flags(disaggregation_mode="decode", disaggregation_prefill_peers="10.0.0.2:8998")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ModelArgs(dtype="float64"), "--dtype must be one of auto, float32, bfloat16, float16"),
        (lambda: ModelArgs(load_format="gguf"), "--load-format must be one of auto, safetensors"),
        (lambda: CacheArgs(page_size=0), "page_size must be >= 1"),
        (lambda: CacheArgs(memory_fraction=1.5), "kv_cache_memory_fraction must be in"),
        (lambda: CacheArgs(dtype="int4"), "--kv-cache-dtype must be one of"),
        (lambda: SchedulerArgs(max_running_requests=0), "max_running_requests must be >= 1"),
        (lambda: SchedulerArgs(policy="random"), "--schedule-policy must be one of lpm, fcfs"),
        (lambda: ParallelArgs(num_threads=0), "num_threads must be >= 1"),
        (lambda: SpecArgs(algorithm="draft"), "needs --speculative-draft-model-path"),
        (lambda: SpecArgs(token_map="/m.pt"), "applies to --speculative-algorithm draft only"),
        (lambda: SpecArgs(ngram_min_match=5), "speculative_ngram_min_match <= speculative_ngram_max_match"),
        (lambda: GrammarArgs(max_pending=0), "grammar_max_pending must be >= 1"),
        (lambda: GrammarArgs(backend="regex"), "--grammar-backend must be one of"),
        (lambda: HttpArgs(health_heartbeat_timeout_s=1), "health_heartbeat_timeout_s must be >= 2"),
        (lambda: HttpArgs(metrics_port=70000), "metrics_port must be a TCP port"),
        (lambda: HttpArgs(reasoning_parser="o1"), "--reasoning-parser must be one of qwen3, deepseek-r1"),
        (lambda: DisaggArgs(mode="decode"), "--disaggregation-prefill-peers"),
        (lambda: DisaggArgs(mode="prefill", timeout_s=0), "disaggregation_timeout_s must be > 0"),
        (lambda: RouterArgs(policy="nearest"), "--router-policy must be one of"),
        (
            lambda: ServerArgs(parallel=ParallelArgs(tp_size=2), disagg=DisaggArgs(mode="prefill")),
            "runs one worker per process",
        ),
        (lambda: ServerArgs(log_level="trace"), "--log-level must be one of"),
    ],
)
def test_each_section_validates_itself(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_sections_are_frozen():
    args = ServerArgs()
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.http.port = 1  # type: ignore[misc]
    assert args.with_flags(port=1).http.port == 1 and args.http.port == 30000


def test_a_child_spec_round_trips_through_json():
    args = ServerArgs.from_flags(
        model_path="/m",
        kv_cache_dtype="fp8",
        tp_size=2,
        speculative_algorithm="ngram",
        tool_call_parser="qwen25",
        log_level="debug",
    )
    spec = ChildSpec(
        args=args, model_path="/m", tokenizer_path="/m", endpoints={"scheduler": "ipc:///s"}, heartbeat="/h"
    )
    decoded = msgspec.json.decode(msgspec.json.encode(spec), type=ChildSpec)
    assert decoded.args == args and decoded.args.cache.dtype == "fp8"


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [
        ('"page_size":1', '"page_size":0', "page_size must be >= 1"),
        ('"dtype":"fp8"', '"dtype":"fp9"', "Invalid enum value 'fp9'"),
    ],
)
def test_json_with_bad_values_is_refused_by_its_section(good, bad, message):
    raw = msgspec.json.encode(ServerArgs.from_flags(kv_cache_dtype="fp8")).decode()
    assert good in raw
    with pytest.raises(msgspec.ValidationError, match=message):
        msgspec.json.decode(raw.replace(good, bad), type=ServerArgs)
