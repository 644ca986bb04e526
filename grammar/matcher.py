"""CompiledGrammar (shared, immutable index + lazy per-state caches) and GrammarMatcher
(one request's position in it).

A state's mask is an int32 bitset over the logits (bit t of word t // 32 = token t allowed),
built once from the index and then copied per step (~1 µs instead of outlines-core's hash-map
walk). EOS is allowed exactly where the sentinel token is, i.e. where the regex may end.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import outlines_core

from grammar.vocabulary import TokenVocabulary

MASK_CACHE_BYTES = 32 << 20  # per grammar; least recently used state masks go first
MAX_JUMP_BYTES = 256  # longest forced string written in one jump


@dataclass
class VocabTables:
    """Per-vocabulary arrays every grammar of that vocabulary shares."""

    vocab: TokenVocabulary
    words: int  # int32 words per mask row
    sentinel: int
    eos_ids: np.ndarray
    first_bytes: np.ndarray
    byte_tokens: dict[int, int]

    @classmethod
    def build(cls, vocab: TokenVocabulary) -> VocabTables:
        return cls(vocab, -(-vocab.logits_size // 32), vocab.sentinel_id, np.array(vocab.eos_ids, dtype=np.int64),
                   vocab.first_bytes(), vocab.byte_tokens())


@dataclass
class _StateInfo:
    allows_end: bool  # EOS allowed here
    terminal: bool  # nothing but EOS allowed: the output is complete
    forced_byte: int  # the only possible next byte, or -1


class CompiledGrammar:
    """An outlines-core Index plus lazily built, bounded per-state masks and jump info."""

    def __init__(self, index: outlines_core.Index, tables: VocabTables, unenforced: list[str], index_bytes: int) -> None:
        self.index = index
        self.tables = tables
        self.unenforced = unenforced
        self.size_bytes = index_bytes
        self.initial = index.get_initial_state()
        self._masks: OrderedDict[int, np.ndarray] = OrderedDict()
        self._info: dict[int, _StateInfo] = {}
        self._max_masks = max(16, MASK_CACHE_BYTES // (tables.words * 4))

    def mask(self, state: int) -> np.ndarray:
        """The int32 bitset of tokens allowed in `state`."""
        row = self._masks.get(state)
        if row is not None:
            self._masks.move_to_end(state)
            return row
        return self._build(state)[0]

    def info(self, state: int) -> _StateInfo:
        found = self._info.get(state)
        return found if found is not None else self._build(state)[1]

    def next_state(self, state: int, token: int) -> int | None:
        return self.index.get_next_state(state, token)

    def _build(self, state: int) -> tuple[np.ndarray, _StateInfo]:
        t = self.tables
        ids = np.asarray(self.index.get_allowed_tokens(state) or [], dtype=np.int64)
        ends = bool((ids == t.sentinel).any())
        ids = ids[(ids != t.sentinel) & (ids < t.vocab.logits_size)]
        ids = ids[~np.isin(ids, t.eos_ids)]  # the index's own end marker; EOS follows the sentinel
        bits = np.zeros(t.words * 32, dtype=bool)
        bits[ids] = True
        if ends:
            bits[t.eos_ids] = True
        row = np.packbits(bits, bitorder="little").view("<i4")
        first = t.first_bytes[ids]
        forced = int(first[0]) if len(first) and not ends and (first == first[0]).all() else -1
        info = _StateInfo(allows_end=ends, terminal=ends and len(ids) == 0, forced_byte=forced)
        self._info[state] = info
        self._masks[state] = row
        if len(self._masks) > self._max_masks:
            self._masks.popitem(last=False)
        return row, info


class GrammarMatcher:
    """One request's walk through a CompiledGrammar."""

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.grammar = grammar
        self.state = grammar.initial

    def fill_bitmask(self, out: np.ndarray) -> None:
        """Write the allowed-token bitset of the current state into `out` (int32 words)."""
        out[:] = self.grammar.mask(self.state)

    def accept_token(self, token: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar does not allow it."""
        nxt = self.grammar.next_state(self.state, token)
        if nxt is None:
            return False
        self.state = nxt
        return True

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by all of `tokens`, or by none of them."""
        start = self.state
        for tok in tokens:
            if not self.accept_token(tok):
                self.state = start
                return False
        return True

    def is_terminated(self) -> bool:
        """The output is complete: only EOS may follow."""
        return self.grammar.info(self.state).terminal

    def allows_end(self) -> bool:
        return self.grammar.info(self.state).allows_end

    def forced_bytes(self) -> bytes:
        """The bytes every valid continuation starts with (empty if the next byte is open)."""
        out = bytearray()
        state = self.state
        byte_tokens = self.grammar.tables.byte_tokens
        while len(out) < MAX_JUMP_BYTES:
            b = self.grammar.info(state).forced_byte
            token = byte_tokens.get(b) if b >= 0 else None
            nxt = self.grammar.next_state(state, token) if token is not None else None
            if nxt is None:
                break
            out.append(b)
            state = nxt
        return bytes(out)
