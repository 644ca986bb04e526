"""ReasoningGate: a constraint that starts after the model's reasoning section.

A reasoning model writes `<think> ... </think>` and then its answer; a JSON schema (or a
tool call) constrains the answer only. The gate wraps any matcher and walks the markers'
token ids:

  maybe     (qwen3 style: the answer may open with the start marker or not) the inner
            mask plus the marker's first token; anything else starts the answer;
  opening   the start marker's remaining tokens;
  thinking  any token but EOS, until the output ends with the end marker's tokens; when
            the budget comes within the end marker plus the answer's minimum, the end
            marker is written (so a budget-aware answer still closes);
  answer    the inner matcher, unchanged.

Every accepted token pushes the phase it left, so `rollback` (jump-forward, speculative
verification) restores both the gate and the inner matcher.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from arbor.grammar.bitmask import set_bits
from arbor.grammar.budget import BUDGET_MARGIN
from arbor.grammar.matcher import Matcher

THINK_START, THINK_END = "<think>", "</think>"  # the section's markers (Qwen3, DeepSeek-R1)
MAYBE, OPENING, THINKING, ANSWER = range(4)


@dataclass(frozen=True)
class _Phase:
    kind: int
    done: int = 0  # marker tokens matched so far (opening: of the start, thinking: of the end)


class ReasoningGate:
    """The matcher interface over `inner`, deferred until after the reasoning section."""

    def __init__(self, inner: Matcher, start_ids: list[int], end_ids: list[int], opens_inside: bool) -> None:
        self.inner = inner
        self.grammar = inner.grammar
        self.budget_aware = inner.budget_aware
        self.start, self.end = list(start_ids), list(end_ids)
        self.phase = _Phase(THINKING if opens_inside else MAYBE)
        self._history: list[tuple[_Phase, bool]] = []  # (phase before, whether the inner matcher took it)
        self._eos = self.grammar.tables.eos_ids

    # ------------------------------------------------------------ masks

    def fill_bitmask(self, out: np.ndarray, remaining: int | None = None) -> None:
        kind = self.phase.kind
        if kind == ANSWER:
            self.inner.fill_bitmask(out, remaining)
        elif kind == MAYBE:
            self.inner.fill_bitmask(out, remaining)
            set_bits(out, [self.start[0]], True)
        elif kind == OPENING:
            _only(out, self.start[self.phase.done])
        elif remaining is not None and remaining <= self.distance() + BUDGET_MARGIN:
            _only(out, self.end[self.phase.done])  # close the section while the answer still fits
        else:
            out[:] = -1
            set_bits(out, self._eos, False)

    def distance(self) -> int:
        """Fewest tokens from here to an output that may end."""
        kind, done = self.phase.kind, self.phase.done
        if kind in (ANSWER, MAYBE):
            return self.inner.distance()
        left = len(self.end) - done if kind == THINKING else len(self.start) - done + len(self.end)
        return left + self.inner.distance()

    def closing(self, remaining: int) -> bool:
        return self.phase.kind in (ANSWER, MAYBE) and self.inner.closing(remaining)

    # ------------------------------------------------------------ steps

    def accept_token(self, token: int) -> bool:
        before = self.phase
        kind, done = before.kind, before.done
        took = False
        if kind == ANSWER or (kind == MAYBE and token != self.start[0]):
            if not self.inner.accept_token(token):
                return False
            took, nxt = True, _Phase(ANSWER)
        elif kind == MAYBE:
            nxt = _Phase(OPENING, 1) if len(self.start) > 1 else _Phase(THINKING)
        elif kind == OPENING:
            if token != self.start[done]:
                return False
            nxt = _Phase(OPENING, done + 1) if done + 1 < len(self.start) else _Phase(THINKING)
        else:
            if token in self._eos:
                return False
            matched = _advance(self.end, done, token)
            nxt = _Phase(ANSWER) if matched == len(self.end) else _Phase(THINKING, matched)
        self._history.append((before, took))
        self.phase = nxt
        return True

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by all of `tokens`, or by none of them."""
        for n, tok in enumerate(tokens):
            if not self.accept_token(tok):
                self.rollback(n)
                return False
        return True

    def rollback(self, tokens: int) -> None:
        inner = 0
        for _ in range(tokens):
            self.phase, took = self._history.pop()
            inner += took
        if inner:
            self.inner.rollback(inner)

    def allows_end(self) -> bool:
        return self.phase.kind == ANSWER and self.inner.allows_end()

    def is_terminated(self) -> bool:
        return self.phase.kind == ANSWER and self.inner.is_terminated()

    def forced_bytes(self) -> bytes:
        return self.inner.forced_bytes() if self.phase.kind == ANSWER else b""


def _advance(marker: list[int], done: int, token: int) -> int:
    """Marker tokens matched after `token`, given `done` matched before it (KMP-free: markers
    are a few tokens long)."""
    seen = [*marker[:done], token]
    for size in range(min(len(seen), len(marker)), 0, -1):
        if seen[-size:] == marker[:size]:
            return size
    return 0


def _only(out: np.ndarray, token: int) -> None:
    out[:] = 0
    set_bits(out, [token], True)
