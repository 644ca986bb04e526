"""ServerArgs: every runtime knob, in typed sections nested in one dataclass (as vLLM's
VllmConfig). Each component receives only its sections; the CLI flags are derived from the
fields, flat as before (`--kv-cache-dtype` is `CacheArgs.dtype`)."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from arbor.runtime.flags import FlagTable, Section, opt
from arbor.runtime.model.weights import WEIGHT_SOURCES

Dtype = Literal["auto", "float32", "bfloat16", "float16"]
KVCacheDtype = Literal["auto", "fp8_e4m3", "fp8"]
AttentionBackend = Literal["auto", "torch", "triton"]
SchedulePolicy = Literal["lpm", "fcfs"]
GrammarBackend = Literal["outlines", "xgrammar", "llguidance"]
ToolCallParser = Literal["qwen25", "llama3", "mistral", "pythonic"]
ReasoningParser = Literal["qwen3", "deepseek-r1"]
SpecAlgorithm = Literal["ngram", "draft"]
RouterPolicy = Literal["cache_aware", "round_robin", "random", "power_of_two"]
DisaggMode = Literal["null", "prefill", "decode"]
TransferBackend = Literal["nixl", "mooncake"]
LogLevel = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True)
class ModelArgs(Section):
    """The checkpoint and how it runs: for the model runner and the loader."""

    path: str | None = opt(
        None, "Hugging Face checkpoint directory; empty = the built-in tiny checkpoint.", "model_path"
    )
    tokenizer_path: str | None = opt(None, "Tokenizer directory; empty = model_path.")
    load_format: str = opt(
        "auto",
        "Format of the checkpoint's weights. auto = the format model_path holds; "
        + "; ".join(f"{name} = {source.expects}" for name, source in WEIGHT_SOURCES.items())
        + ".",
        choices=("auto", *WEIGHT_SOURCES),
    )
    dtype: Dtype = opt(
        "auto",
        "Weight and activation dtype. auto = bfloat16 on CUDA and on CPUs with fast bf16 "
        "(avx512_bf16 or AMX), else float32.",
    )
    device: str = opt("auto", "Device to run on. auto = cuda when available, else cpu.")
    context_length: int | None = opt(None, "Longest prompt + output in tokens; empty = the checkpoint's own limit.")
    attention_backend: AttentionBackend = opt(
        "auto",
        "Attention implementation: triton (the Triton kernels, with fused RMSNorm, SiLU and "
        "RoPE; CUDA only) or torch (any device). auto = triton on CUDA, torch elsewhere.",
    )


@dataclass(frozen=True)
class CacheArgs(Section):
    """The KV cache: its pool, pages and prefix reuse; for the KV pool and the KV manager."""

    page_size: int = opt(1, "KV-cache slots per page (1 = token-level pages).")
    max_total_tokens: int | None = opt(
        None,
        "KV-cache capacity in tokens; empty = min(max_running_requests * context_length, "
        "what kv_cache_memory_fraction of free memory holds).",
    )
    dtype: KVCacheDtype = opt(
        "auto",
        "KV-cache storage. auto = the model's dtype; fp8_e4m3 (or fp8) = float8 e4m3, half the "
        "bytes of bf16 (twice the tokens in the same memory), values saturating at +-448 (scale 1, as "
        "vLLM without calibrated scales), widened back in attention.",
        "kv_cache_dtype",
    )
    memory_fraction: float = opt(
        0.25,
        "Fraction of free memory (after weights) the KV cache may take when sized automatically.",
        "kv_cache_memory_fraction",
    )
    disable_radix_cache: bool = opt(False, "Do not reuse KV of shared prefixes.")

    def validate(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise ValueError("kv_cache_memory_fraction must be in (0, 1]")


@dataclass(frozen=True)
class SchedulerArgs(Section):
    """Batching: how many requests run, how prompts are split and in which order they go."""

    max_running_requests: int = opt(64, "Most requests decoded together in one batch.")
    chunked_prefill_size: int = opt(
        2048,
        "Longest prompt piece prefilled in one step; longer prompts are split and "
        "interleaved with decode steps (0 = never split).",
    )
    enable_mixed_chunk: bool = opt(
        True,
        "Run prefill chunks and the running requests' decode step in one forward (mixed "
        "batches), so decoding does not pause while a prompt is prefilled (SGLang's flag; on by "
        "default here, --no-enable-mixed-chunk turns it off).",
    )
    max_prefill_tokens: int = opt(8192, "Token budget of one prefill batch.")
    policy: SchedulePolicy = opt(
        "lpm",
        "Order of waiting requests: lpm = longest cached prefix first (cache-aware), fcfs = arrival order.",
        "schedule_policy",
    )
    max_skips: int = opt(
        16,
        "A waiting request passed over this many times goes first (no starvation under lpm).",
        "schedule_max_skips",
    )
    random_seed: int = opt(0, "Seed for requests that give no seed of their own.")

    def validate(self) -> None:
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.chunked_prefill_size < 0 or self.max_prefill_tokens < 1:
            raise ValueError("chunked_prefill_size must be >= 0 and max_prefill_tokens >= 1")


@dataclass(frozen=True)
class ParallelArgs(Section):
    """How the work is spread over processes and cores: for the process launchers (tensor-parallel
    ranks, data-parallel workers), never for the scheduler, to which parallelism is invisible."""

    tp_size: int = opt(
        1,
        "Tensor parallelism: split each layer's heads and MLP columns over this many scheduler "
        "processes (ranks) in lockstep, over torch.distributed (gloo on CPUs, NCCL on GPUs). On a CPU "
        "each rank takes an equal share of the cores.",
    )
    dp_size: int = opt(
        1,
        "Data parallelism: start this many independent worker servers (each with --tp-size ranks and "
        "its own radix cache) on free 127.0.0.1 ports, and sglang-router in front of them on --host/--port.",
    )
    num_threads: int | None = opt(
        None,
        "CPU threads of each rank's forward; empty = torch's default with one rank, the cores split "
        "evenly between ranks and data-parallel workers otherwise.",
    )

    def validate(self) -> None:
        if self.tp_size < 1 or self.dp_size < 1:
            raise ValueError(f"tp_size and dp_size must be >= 1, got {self.tp_size} and {self.dp_size}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}")


@dataclass(frozen=True)
class SpecArgs(Section):
    """Speculative decoding: for the proposers and the speculative step."""

    algorithm: SpecAlgorithm | None = opt(
        None,
        "Speculative decoding: guess each request's next tokens, verify them in one forward. ngram = "
        "guesses from the request's own prompt and output (prompt lookup); draft = a smaller checkpoint's "
        "greedy guesses (--speculative-draft-model-path); empty = off. Greedy outputs are unchanged; "
        "sampled ones keep the target distribution (rejection sampling).",
        "speculative_algorithm",
    )
    draft_model_path: str | None = opt(
        None,
        "The draft checkpoint for --speculative-algorithm draft (same tokenizer as the target); it gets "
        "its own KV cache and radix tree, as many tokens as the target's.",
        "speculative_draft_model_path",
    )
    token_map: str | None = opt(
        None,
        "A torch file with a 1-D tensor of frequent token ids (SGLang's format): the draft's LM head "
        "computes only those (FR-Spec), a cheaper draft step; outputs are unchanged, acceptance may drop.",
        "speculative_token_map",
    )
    num_draft_tokens: int = opt(
        4, "Guesses per request per step (K); a step commits 1 to K + 1 tokens.", "speculative_num_draft_tokens"
    )
    ngram_min_match: int = opt(
        1, "Shortest suffix of a request's tokens looked up for guesses.", "speculative_ngram_min_match"
    )
    ngram_max_match: int = opt(
        4, "Longest suffix looked up (longer matches are tried first).", "speculative_ngram_max_match"
    )
    max_batch: int = opt(
        8,
        "Speculate only while at most this many requests decode: larger batches are compute-bound, "
        "where verifying K extra tokens a request costs more than the accepted ones save.",
        "speculative_max_batch",
    )

    def validate(self) -> None:
        if self.num_draft_tokens < 1 or self.max_batch < 1:
            raise ValueError("speculative_num_draft_tokens and speculative_max_batch must be >= 1")
        if self.algorithm == "draft" and not self.draft_model_path:
            raise ValueError("--speculative-algorithm draft needs --speculative-draft-model-path")
        if self.token_map and self.algorithm != "draft":
            raise ValueError("--speculative-token-map applies to --speculative-algorithm draft only")
        if not 1 <= self.ngram_min_match <= self.ngram_max_match:
            raise ValueError("need 1 <= speculative_ngram_min_match <= speculative_ngram_max_match")


@dataclass(frozen=True)
class GrammarArgs(Section):
    """Constrained output: for the grammar manager and its compile service."""

    backend: GrammarBackend = opt(
        "outlines",
        "What compiles constraints and writes their masks: outlines (Arbor's JSON-schema->regex "
        "on outlines-core's automaton; budget-aware closing of JSON), xgrammar or llguidance (pushdown "
        "automata: also EBNF and structural tags). On outlines, EBNF and structural tags go to xgrammar.",
        "grammar_backend",
    )
    workers: int = opt(
        2, "Constraint compile worker processes (each compiles one grammar at a time).", "grammar_workers"
    )
    compile_timeout_s: float = opt(
        10.0,
        "Longest a constraint may compile; slower ones end their request with an error.",
        "grammar_compile_timeout_s",
    )
    max_memory_mb: int = opt(
        4096,
        "Address-space cap of a compile worker; a constraint needing more fails alone.",
        "grammar_max_memory_mb",
    )
    max_pending: int = opt(
        64,
        "Distinct constraints compiling or queued at once; a request beyond it ends with 429 (retry).",
        "grammar_max_pending",
    )
    max_mask_ms: float = opt(
        50.0,
        "Longest one request's grammar may take to write a step's mask; a slower one (an ambiguous "
        "EBNF on a pushdown backend grows with the output) ends its request with an error instead of "
        "stalling the batch.",
        "grammar_max_mask_ms",
    )
    cache_mb: int = opt(512, "Compiled constraints kept in memory (LRU, by index size).", "grammar_cache_mb")
    cache_dir: str | None = opt(None, "Directory for compiled constraints on disk; empty = none.", "grammar_cache_dir")
    disable_jump_forward: bool = opt(
        False, "Sample every token of constrained output, even where the grammar forces the text."
    )

    def validate(self) -> None:
        if self.max_mask_ms <= 0:
            raise ValueError(f"grammar_max_mask_ms must be > 0, got {self.max_mask_ms}")
        if self.max_pending < 1:
            raise ValueError(f"grammar_max_pending must be >= 1, got {self.max_pending}")
        if self.workers < 1 or self.compile_timeout_s <= 0 or self.max_memory_mb < 256:
            raise ValueError(
                "grammar_workers must be >= 1, grammar_compile_timeout_s > 0, grammar_max_memory_mb >= 256"
            )


@dataclass(frozen=True)
class HttpArgs(Section):
    """The front door: the HTTP listener, its keys and limits, and the shape of its answers; for
    the HTTP app and the tokenizer manager."""

    host: str = opt("127.0.0.1", "HTTP server address; the default serves this machine only.")
    port: int = opt(30000, "HTTP server port.")
    metrics_port: int | None = opt(
        None,
        "Also serve /metrics (the whole server's Prometheus metrics) on this port of 127.0.0.1, "
        "without a key, for a scraper on this machine; on --port, /metrics needs the admin key. With "
        "--dp-size N, worker i serves it on this port + i.",
    )
    api_key: str | None = opt(
        None,
        "If set, every route but /health needs `Authorization: Bearer KEY`; the key also "
        "salts the radix cache, so different keys never share cached prefixes. A flag is visible "
        "to every local user in the process list: prefer --api-key-file or ARBOR_API_KEY.",
    )
    api_key_file: str | None = opt(
        None,
        "File of API keys, one tenant a line: each its own cache namespace, aborting only its own "
        "requests. ARBOR_API_KEY in the environment is one more tenant key.",
    )
    admin_api_key_file: str | None = opt(
        None,
        "File whose first line is the admin key (or ARBOR_ADMIN_API_KEY): it may flush the cache "
        "and abort any request. Without one, a lone tenant key is the admin key.",
    )
    enable_cache_report: bool = opt(
        False,
        "Report cached prompt tokens in OpenAI usage (prompt_tokens_details); off by default, "
        "since it tells a caller how much of its prompt someone else sent before.",
    )
    incremental_streaming_output: bool = opt(
        False,
        "Native streams send only what is new in each event (text, ids, logprobs) instead of "
        "SGLang's default, the whole output so far.",
    )
    served_model_name: str | None = opt(None, "Model name in the OpenAI API; empty = the checkpoint directory's name.")
    max_body_bytes: int = opt(4 << 20, "Largest HTTP request body accepted (413 above it).")
    max_n: int = opt(16, "Largest n (samples per prompt) a request may ask for.")
    max_batch_prompts: int = opt(256, "Most prompts in one batched request.")
    max_concurrent_requests: int = opt(1024, "Requests in flight at once; more are refused with 429 until some finish.")
    max_connections: int = opt(
        2048,
        "Open HTTP connections at once; a connection beyond them gets 503 "
        "(--max-concurrent-requests bounds the requests that run).",
    )
    header_timeout_s: float = opt(
        10.0, "Longest a client may take to send a request's headers; then the connection is closed."
    )
    body_timeout_s: float = opt(30.0, "Longest wait for the next piece of a request body (408 after it).")
    body_deadline_s: float = opt(
        60.0, "Longest a request body may take in all, however steadily it trickles in (408 after it)."
    )
    keep_alive_timeout_s: int = opt(5, "Idle keep-alive connections close after this many seconds.")
    health_heartbeat_timeout_s: float = opt(
        20.0,
        "/health answers 503 naming the process when the scheduler's or the detokenizer's loop has "
        "not come around for this many seconds (one stuck step, or a stopped process); idle loops come "
        "around every second, so an idle server stays healthy.",
    )
    tool_call_parser: ToolCallParser | None = opt(
        None,
        "The model family's tool-call format, for tools in chat requests: qwen25 (<tool_call> JSON "
        "blocks), llama3 (JSON calls joined by '; '), mistral ([TOOL_CALLS] and a JSON list), pythonic "
        '([f(a=1)]). Empty = tool calls are not parsed (tool_choice "none" only).',
    )
    reasoning_parser: ReasoningParser | None = opt(
        None,
        "Split the model's <think>...</think> section into reasoning_content in chat answers: qwen3 "
        "(only when the answer opens with <think>), deepseek-r1 (the answer starts inside it). Empty = "
        "reasoning stays in content.",
    )

    def validate(self) -> None:
        if self.health_heartbeat_timeout_s < 2:  # idle loops beat once a second
            raise ValueError(f"health_heartbeat_timeout_s must be >= 2, got {self.health_heartbeat_timeout_s}")
        if min(self.max_n, self.max_batch_prompts, self.max_concurrent_requests, self.max_body_bytes) < 1:
            raise ValueError("max_n, max_batch_prompts, max_concurrent_requests and max_body_bytes must be >= 1")
        if (
            self.max_connections < 1
            or min(self.header_timeout_s, self.body_timeout_s, self.body_deadline_s, self.keep_alive_timeout_s) <= 0
        ):
            raise ValueError("max_connections must be >= 1 and the connection timeouts > 0")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise ValueError(f"metrics_port must be a TCP port (1-65535), got {self.metrics_port}")


@dataclass(frozen=True)
class DisaggArgs(Section):
    """Prefill/decode disaggregation: for the PD role, the bootstrap gate and the PD secret."""

    mode: DisaggMode = opt(
        "null",
        "Prefill/decode disaggregation (behind sglang-router --pd-disaggregation). prefill = compute "
        "each prompt's KV, write it into the decode worker's pool and answer with the first token; decode = "
        "take each request's prompt KV from the prefill worker its bootstrap fields name, then decode; "
        "null = a normal worker.",
        "disaggregation_mode",
    )
    transfer_backend: TransferBackend = opt(
        "nixl",
        "How KV moves between prefill and decode workers: nixl (NIXL, UCX backend: host or GPU "
        "memory, RDMA where present). mooncake is SGLang's other engine; Arbor refuses it with a message.",
        "disaggregation_transfer_backend",
    )
    bootstrap_port: int = opt(
        8998,
        "With --disaggregation-mode prefill: the TCP port (on --host) where decode workers ask for "
        "KV; give the router the same port (--prefill URL PORT).",
        "disaggregation_bootstrap_port",
    )
    secret_file: str | None = opt(
        None,
        "File whose first line is the PD secret shared by sglang-router (its --api-key) and every "
        "prefill and decode worker (or ARBOR_PD_SECRET in the environment; never a flag). Required with "
        "--disaggregation-mode: only a caller presenting it may set bootstrap fields, and it signs every "
        "bootstrap message.",
        "disaggregation_secret_file",
    )
    prefill_peers: str | None = opt(
        None,
        "With --disaggregation-mode decode (required there): comma-separated HOST:PORT bootstrap "
        "addresses of the prefill workers this worker may pull KV from, as the router names them "
        "(--prefill URL PORT).",
        "disaggregation_prefill_peers",
    )
    staging_mb: int = opt(
        1024,
        "With --disaggregation-mode decode: most MB of staging buffers (KV on its way in, one per "
        "pull) held at once; a pull beyond it waits (one is always let through).",
        "disaggregation_staging_mb",
    )
    allowed_peers: str | None = opt(
        None,
        "Comma-separated client addresses (IPs) that may set bootstrap fields without presenting the "
        "PD secret, e.g. the router's host in a private network; empty = none.",
        "disaggregation_allowed_peers",
    )
    ib_device: str | None = opt(
        None,
        "The network device the KV transfer (UCX) uses, e.g. mlx5_0:1 or eth1; empty = the interface "
        "--host names (lo for 127.0.0.1), so the transfer never listens beyond the HTTP server's reach.",
        "disaggregation_ib_device",
    )
    timeout_s: float = opt(
        30.0,
        "Longest a disaggregated request waits for its partner: the decode worker for the KV, the "
        "prefill worker for the decode worker's pull; then it ends with an error on that side.",
        "disaggregation_timeout_s",
    )

    def validate(self) -> None:
        if self.mode == "null":
            return
        if self.timeout_s <= 0:
            raise ValueError("disaggregation_timeout_s must be > 0")
        if self.mode == "decode" and not self.prefill_peers:
            raise ValueError(
                "--disaggregation-mode decode needs --disaggregation-prefill-peers HOST:PORT,... "
                "(the prefill workers' bootstrap addresses, as the router names them): a decode "
                "worker sends its pulls to no other host"
            )
        if self.staging_mb < 1:
            raise ValueError("disaggregation_staging_mb must be >= 1")


@dataclass(frozen=True)
class RouterArgs(Section):
    """sglang-router in front of --dp-size workers: for the data-parallel supervisor."""

    policy: RouterPolicy = opt(
        "cache_aware",
        "With --dp-size: how sglang-router picks a worker. cache_aware sends a request where "
        "the longest prefix of its text was sent before (so a conversation stays where its KV is) unless "
        "the load is unbalanced.",
        "router_policy",
    )
    cache_threshold: float = opt(
        0.3,
        "With --dp-size and cache_aware: the share of a request's text that must match a worker's "
        "earlier traffic for the router to follow the match; below it, the least-loaded worker is taken.",
        "router_cache_threshold",
    )
    balance_abs_threshold: int = opt(
        64,
        "With --dp-size and cache_aware: the router ignores cache affinity and picks the least-loaded "
        "worker once the busiest worker has this many more requests in flight than the idlest "
        "(and --router-balance-rel-threshold times as many).",
        "router_balance_abs_threshold",
    )
    balance_rel_threshold: float = opt(
        1.5,
        "With --dp-size and cache_aware: see --router-balance-abs-threshold.",
        "router_balance_rel_threshold",
    )


@dataclass(frozen=True)
class ServerArgs(Section):
    """The whole configuration: the sections, and the log level every process shares. Built from
    flags with `from_flags(**flags)` (as `Engine(**kwargs)` and the CLI do)."""

    model: ModelArgs = field(default_factory=ModelArgs)
    cache: CacheArgs = field(default_factory=CacheArgs)
    scheduler: SchedulerArgs = field(default_factory=SchedulerArgs)
    parallel: ParallelArgs = field(default_factory=ParallelArgs)
    spec: SpecArgs = field(default_factory=SpecArgs)
    grammar: GrammarArgs = field(default_factory=GrammarArgs)
    http: HttpArgs = field(default_factory=HttpArgs)
    disagg: DisaggArgs = field(default_factory=DisaggArgs)
    router: RouterArgs = field(default_factory=RouterArgs)
    log_level: LogLevel = opt("info", "Logging level.")

    def validate(self) -> None:
        """What no one section can check alone."""
        if self.disagg.mode != "null" and (
            self.parallel.tp_size > 1 or self.parallel.dp_size > 1 or self.spec.algorithm
        ):
            raise ValueError(
                "--disaggregation-mode runs one worker per process: start each prefill and "
                "decode worker on its own, without --tp-size, --dp-size or speculative decoding"
            )

    @classmethod
    def from_flags(cls, **flags: Any) -> ServerArgs:
        """The defaults with `flags` (by flag name: model_path=..., kv_cache_dtype=...) applied."""
        return cls().with_flags(**flags)

    def with_flags(self, **flags: Any) -> ServerArgs:
        """A copy with `flags` (by flag name) replaced; every changed section checks itself again."""
        return _table().replace(self, **flags)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        """Add one `--flag` per field, with its type, default and help, a group per section."""
        _table().add_to(parser)

    def to_cli_args(self, **overrides: Any) -> list[str]:
        """The flags that rebuild these args with `overrides` applied (defaults left out)."""
        return _table().argv(self.with_flags(**overrides))

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> ServerArgs:
        """Build ServerArgs from a parsed namespace (extra attributes are ignored)."""
        return cls.from_flags(**{k: v for k, v in vars(ns).items() if k in _table().flags})


@functools.cache
def _table() -> FlagTable:
    return FlagTable(ServerArgs)
