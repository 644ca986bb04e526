"""Req: one request inside the scheduler, from waiting to finished."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from arbor.grammar.matcher import Matcher
from arbor.radix.node import TreeNode
from arbor.runtime.io.messages import Bootstrap, FinishReason, OutputOptions
from arbor.runtime.sampling.params import SamplingParams


class ReqStatus(Enum):
    """Where a request stands. The scheduler sets it at each transition; which queue holds the
    request follows from it (COMPILING: `compiling`, WAITING: `waiting`, RUNNING: `running`).
    PREFILLING and RUNNING requests hold KV (a slot-table row); the others hold none in the
    scheduler's name (a disaggregated side holds a TRANSFERRING request's KV itself)."""

    COMPILING = "compiling"  # its grammar is being compiled
    WAITING = "waiting"  # queued for prefill (new, put back, or retracted)
    PREFILLING = "prefilling"  # admitted: its prompt is being prefilled, maybe chunk by chunk
    RUNNING = "running"  # decoding
    TRANSFERRING = "transferring"  # disaggregated: its KV travels between prefill and decode workers
    FINISHED = "finished"  # ended; its final output is built


@dataclass(eq=False)
class Req:
    """A request's tokens, sampling settings and KV bookkeeping.

    KV of positions [0, tree_len) belongs to the radix tree (held by a lock on
    `last_node`); positions [tree_len, mapped_len) map to private slots of this request.
    Positions [0, kv_len) have K/V written.
    """

    rid: str
    origin_ids: array[int]
    params: SamplingParams
    group: str = ""  # the rid the client sent; the n samples of one request share it
    stream: bool = False
    return_logprob: bool = False
    cache_salt: str | None = None
    output: OutputOptions = field(default_factory=OutputOptions)
    output_ids: list[int] = field(default_factory=list)
    logprob_start: int = -1  # >= 0: prompt logprobs wanted from this position
    top_logprobs_num: int = 0
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    arrival: int = 0  # admission order, for FCFS and anti-starvation
    status: ReqStatus = ReqStatus.WAITING
    # KV state while running
    row: int = -1
    last_node: TreeNode | None = None
    tree_len: int = 0
    kv_len: int = 0
    mapped_len: int = 0
    cached_tokens: int = 0
    prefix_matched: int = 0  # tree hit length at the last match, for LPM ordering
    skipped: int = 0  # times a later request was admitted first
    retractions: int = 0
    admitted: bool = False  # counted in the prompt/cached token counters (once, at first admission)
    sent_ids: int = 0  # output ids already sent down the ring
    spec_verify_ct: int = 0  # speculative verify steps this request took part in
    finish_reason: FinishReason | None = None
    constraint: Any = None  # grammar.Constraint of a constrained request
    grammar_future: Any = None  # Future of its CompiledGrammar while it compiles
    matcher: Matcher | None = None  # its grammar's matcher once compiled (a ReasoningGate around it with `reasoning`)
    reasoning: Any = None  # messages.ReasoningMarkers: the constraint starts after the reasoning section
    grammar_too_slow: bool = False  # one mask took longer than --grammar-max-mask-ms: end it
    bootstrap: Bootstrap | None = None  # prefill/decode disaggregation: the KV's source and room

    @property
    def seq_len(self) -> int:
        """Prompt + output tokens."""
        return len(self.origin_ids) + len(self.output_ids)

    def fill_ids(self) -> array[int]:
        """Every token whose KV a prefill must produce: the prompt and, after a retraction,
        the output so far."""
        return self.origin_ids + array("i", self.output_ids)

    @property
    def match_cap(self) -> int:
        """Longest prefix it may take from the cache: at least one token is computed, and
        prompt logprobs need the logits of every position from logprob_start - 1 on."""
        cap = self.seq_len - 1
        if self.wants_prompt_logprobs:
            cap = min(cap, max(self.logprob_start - 1, 0))
        return cap

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for and not yet computed (a recompute never redoes them)."""
        return self.logprob_start >= 0 and self.retractions == 0 and not self.output_ids

    @property
    def pending_len(self) -> int:
        """Tokens sampled or forced but not yet forwarded (1 while decoding; more after a
        jump-forward)."""
        return self.seq_len - self.kv_len

    @property
    def remaining_new_tokens(self) -> int:
        return max(self.params.max_new_tokens - len(self.output_ids), 0)
