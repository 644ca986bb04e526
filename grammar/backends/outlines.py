"""The outlines backend (the default): Arbor's regex over an outlines-core Index.

CompiledGrammar (shared, immutable index + lazy per-state caches) and GrammarMatcher (one
request's position in it). A state's mask is written once per state by outlines-core's
`Guide.write_mask_into` (each matcher keeps a Guide in step with it, so a first visit costs
~0.1 ms even for a 50k-token state) and then copied per step (~1 µs). EOS is allowed exactly
where the sentinel token is, i.e. where the regex may end. Only this backend is budget-aware
(its automaton gives each state's distance to an end, grammar/budget.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import outlines_core

from arbor.grammar.bitmask import VocabTables, has_bit, set_bits
from arbor.grammar.budget import BUDGET_MARGIN, Distances
from arbor.grammar.jump_forward import MAX_JUMP_BYTES

MASK_CACHE_BYTES = 32 << 20  # per grammar; least recently used state masks go first


@dataclass
class _StateInfo:
    allows_end: bool  # EOS allowed here
    terminal: bool  # nothing but EOS allowed: the output is complete
    forced_byte: int  # the only possible next byte, or -1


class CompiledGrammar:
    """An outlines-core Index plus lazily built, bounded per-state masks and jump info.
    Masks are built through a Guide standing at the state (see GrammarMatcher)."""

    def __init__(
        self,
        index: outlines_core.Index,
        tables: VocabTables,
        unenforced: list[str],
        index_bytes: int,
        distances: Distances | None = None,
    ) -> None:
        self.index = index
        self.tables = tables
        self.unenforced = unenforced
        self.size_bytes = index_bytes
        self.initial = index.get_initial_state()
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._info: dict[int, _StateInfo] = {}
        self._max_masks = max(16, MASK_CACHE_BYTES // (tables.words * 4))
        self._distances = distances

    def matcher(self, budget_aware: bool = False) -> GrammarMatcher:
        """A fresh matcher at the initial state."""
        return GrammarMatcher(self, budget_aware)

    @property
    def distances(self) -> Distances:
        """Fewest tokens to an end from each state (the worker builds them for JSON; for other
        kinds they are built here on first use)."""
        if self._distances is None:
            self._distances = Distances.build(self.index, self.tables.sentinel)
        return self._distances

    def limited_mask(self, state: int, guide: outlines_core.Guide, most: int) -> np.ndarray:
        """The mask of `state` kept to tokens after which an end is at most `most` tokens away
        (and EOS where the output may end)."""
        row = self.mask(state, guide)
        end = None
        if self.info(state, guide).allows_end:
            end = np.zeros_like(row)
            set_bits(end, self.tables.eos_ids, on=True)
        return self.distances.limited(self.index, state, row, end, most)

    def mask(self, state: int, guide: outlines_core.Guide) -> np.ndarray:
        """The int32 bitset of tokens allowed in `state`; `guide` stands at `state`."""
        row = self._masks.get(state)
        if row is not None:
            self._masks.move_to_end(state)
            return row
        return self._build(state, guide)[0]

    def info(self, state: int, guide: outlines_core.Guide) -> _StateInfo:
        found = self._info.get(state)
        return found if found is not None else self._build(state, guide)[1]

    def next_state(self, state: int, token: int) -> int | None:
        return self.index.get_next_state(state, token)

    def _build(self, state: int, guide: outlines_core.Guide) -> tuple[np.ndarray, _StateInfo]:
        t = self.tables
        wide = np.zeros(t.index_words, dtype=np.int32)
        guide.write_mask_into(wide.ctypes.data, wide.size, 4)
        row = wide[: t.words].copy()
        ends = has_bit(row, t.sentinel)
        set_bits(row, np.append(t.eos_ids, t.sentinel), on=False)  # EOS follows the sentinel only
        terminal = ends and not row.any()
        forced = -1 if ends else t.forced_byte(row)
        if ends:
            set_bits(row, t.eos_ids, on=True)
        info = _StateInfo(allows_end=ends, terminal=terminal, forced_byte=forced)
        self._info[state] = info
        self._masks[state] = row
        if len(self._masks) > self._max_masks:
            self._masks.popitem(last=False)
        return row, info


class GrammarMatcher:
    """One request's walk through a CompiledGrammar, with an outlines-core Guide kept at the
    same state (it writes the masks of states seen first here)."""

    def __init__(self, grammar: CompiledGrammar, budget_aware: bool = False) -> None:
        self.grammar = grammar
        self.state = grammar.initial
        self.budget_aware = budget_aware
        self._guide = outlines_core.Guide(grammar.index, max_rollback=MAX_JUMP_BYTES + 2)

    def fill_bitmask(self, out: np.ndarray, remaining: int | None = None) -> None:
        """Write the allowed-token bitset of the current state into `out` (int32 words); with
        `remaining` tokens of budget left (budget-aware), only tokens that keep the output
        closable within them (budget.py)."""
        most = (
            self.grammar.distances.limit(self.state, remaining) if remaining is not None and self.budget_aware else None
        )
        if most is not None:
            out[:] = self.grammar.limited_mask(self.state, self._guide, most)
        else:
            out[:] = self.grammar.mask(self.state, self._guide)

    def distance(self) -> int:
        """Fewest tokens from here to an output that may end."""
        return self.grammar.distances.of(self.state)

    def closing(self, remaining: int) -> bool:
        """Whether `remaining` tokens of budget are few enough that the output must close now."""
        return self.budget_aware and remaining <= self.distance() + BUDGET_MARGIN

    def accept_token(self, token: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar does not allow it."""
        nxt = self.grammar.next_state(self.state, token)
        if nxt is None:
            return False
        self._guide.advance(token, return_tokens=False)
        self.state = nxt
        return True

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by all of `tokens`, or by none of them."""
        state = self.state
        for tok in tokens:
            nxt = self.grammar.next_state(state, tok)
            if nxt is None:
                return False
            state = nxt
        for tok in tokens:
            self._guide.advance(tok, return_tokens=False)
        self.state = state
        return True

    def rollback(self, tokens: int) -> None:
        """Undo the last `tokens` accepted tokens (at most MAX_JUMP_BYTES)."""
        self._guide.rollback_state(tokens)
        self.state = self._guide.get_state()

    def is_terminated(self) -> bool:
        """The output is complete: only EOS may follow."""
        return self.grammar.info(self.state, self._guide).terminal

    def allows_end(self) -> bool:
        return self.grammar.info(self.state, self._guide).allows_end

    def forced_bytes(self) -> bytes:
        """The bytes every valid continuation starts with (empty if the next byte is open).
        The guide walks ahead to build each state's info, then steps back."""
        out = bytearray()
        state = self.state
        byte_tokens = self.grammar.tables.byte_tokens
        try:
            while len(out) < MAX_JUMP_BYTES:
                b = self.grammar.info(state, self._guide).forced_byte
                token = byte_tokens.get(b) if b >= 0 else None
                nxt = self.grammar.next_state(state, token) if token is not None else None
                if nxt is None:
                    break
                self._guide.advance(token, return_tokens=False)
                out.append(b)
                state = nxt
        finally:
            if out:
                self._guide.rollback_state(len(out))
        return bytes(out)
