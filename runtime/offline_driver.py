"""In-process generation loop over a ModelRunner: admit, prefill, decode, finish.

A small continuous batcher without a radix cache or retraction: a request is admitted only
when the KV pool can hold its whole prompt + max_new_tokens next to what running requests
may still need, so a step never runs out of slots. The scheduler process replaces it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.memory import reserve_positions
from runtime.model.forward_batch import ForwardBatch, ForwardMode
from runtime.model.runner import ModelRunner
from runtime.model.sampler import Sampler, SamplingBatch
from runtime.sampling_params import SamplingParams


@dataclass
class Sequence:
    """One request while it generates."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    row: int = -1
    finish_reason: dict[str, Any] | None = None

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def max_len(self) -> int:
        return len(self.input_ids) + self.params.max_new_tokens


@dataclass
class StepStats:
    """Wall time and tokens of prefill and decode steps, for tokens/s reports."""

    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_s: float = 0.0
    decode_tokens: int = 0


class OfflineDriver:
    """Runs lists of Sequences to completion on one ModelRunner."""

    def __init__(self, runner: ModelRunner, seed: int, max_running: int) -> None:
        self.runner = runner
        self.max_running = max_running
        self.sampler = Sampler(seed, runner.device)
        self.eos_ids = set(runner.config.eos_token_ids)
        self.stats = StepStats()

    def run(self, seqs: list[Sequence], on_finish: Callable[[Sequence], None] | None = None) -> None:
        """Generate every sequence; `on_finish` is called as each one completes."""
        capacity = self.runner.allocator.total_slots
        for s in seqs:
            if s.max_len > capacity:
                raise ValueError(
                    f"request needs {s.max_len} KV slots (prompt + max_new_tokens) but the cache holds "
                    f"{capacity}; lower max_new_tokens or raise max_total_tokens"
                )
        waiting = deque(s for s in seqs if not self._finish_trivial(s, on_finish))
        running: list[Sequence] = []
        while waiting or running:
            admitted = self._admit(waiting, running)
            batch = admitted or running
            self._step(batch, ForwardMode.EXTEND if admitted else ForwardMode.DECODE)
            running.extend(admitted)
            for s in [s for s in running if s.finish_reason is not None]:
                running.remove(s)
                self._release(s)
                if on_finish is not None:
                    on_finish(s)

    def _finish_trivial(self, s: Sequence, on_finish: Callable[[Sequence], None] | None) -> bool:
        if s.params.max_new_tokens > 0:
            return False
        s.finish_reason = {"type": "length", "length": 0}
        if on_finish is not None:
            on_finish(s)
        return True

    def _admit(self, waiting: deque[Sequence], running: list[Sequence]) -> list[Sequence]:
        ps = self.runner.allocator.page_size

        def pages_needed(s: Sequence) -> int:
            return -(-s.max_len // ps)

        promised = sum(pages_needed(s) - -(-s.seq_len // ps) for s in running)
        free = self.runner.allocator.available() // ps - promised
        admitted: list[Sequence] = []
        while waiting and len(running) + len(admitted) < self.max_running:
            if pages_needed(waiting[0]) > free:
                break
            s = waiting.popleft()
            free -= pages_needed(s)
            row = self.runner.req_to_token.alloc()
            assert row is not None, "max_running bounds the rows in use"
            s.row = row
            admitted.append(s)
        return admitted

    def _step(self, seqs: list[Sequence], mode: ForwardMode) -> None:
        t0 = time.perf_counter()
        if mode is ForwardMode.EXTEND:
            new = [s.input_ids for s in seqs]
            starts = [0] * len(seqs)
        else:
            new = [[s.output_ids[-1]] for s in seqs]
            starts = [s.seq_len - 1 for s in seqs]
        rows = [s.row for s in seqs]
        ends = [st + len(ids) for st, ids in zip(starts, new)]
        loc = reserve_positions(self.runner.req_to_token, self.runner.allocator, rows, starts, ends)
        assert loc is not None, "admission reserved room for every running sequence"
        batch = ForwardBatch.build(mode, new, starts, rows, loc, self.runner.req_to_token.table)
        logits = self.runner.forward(batch).next_token_logits
        sampling = SamplingBatch.build(
            [s.params for s in seqs], [len(s.output_ids) for s in seqs],
            logits.shape[-1], self.runner.device,
        )
        tokens = self.sampler(logits, sampling).tolist()
        for s, tok in zip(seqs, tokens):
            s.output_ids.append(tok)
            s.finish_reason = self._check_finish(s, tok)
        elapsed = time.perf_counter() - t0
        if mode is ForwardMode.EXTEND:
            self.stats.prefill_s += elapsed
            self.stats.prefill_tokens += sum(len(ids) for ids in new)
        else:
            self.stats.decode_s += elapsed
            self.stats.decode_tokens += len(seqs)

    def _check_finish(self, s: Sequence, tok: int) -> dict[str, Any] | None:
        if tok in s.params.stop_token_ids or (tok in self.eos_ids and not s.params.ignore_eos):
            return {"type": "stop", "matched": tok}
        if len(s.output_ids) >= s.params.max_new_tokens:
            return {"type": "length", "length": len(s.output_ids)}
        return None

    def _release(self, s: Sequence) -> None:
        table = self.runner.req_to_token.table
        ps = self.runner.allocator.page_size
        mapped = -(-(s.seq_len - 1) // ps) * ps  # the last token's KV was never written
        self.runner.allocator.free_slots(table[s.row, :mapped].to(torch.int64))
        self.runner.req_to_token.free(s.row)
