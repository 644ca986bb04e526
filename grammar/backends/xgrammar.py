"""The xgrammar backend (`--grammar-backend xgrammar`): JSON schema, regex, EBNF, structural tags.

xgrammar compiles in the worker process (grammar/worker.py) against a TokenizerInfo built
from Arbor's own token bytes, so its masks line up with the other backends' bit for bit; the
compiled grammar comes back in xgrammar's JSON serialization. A matcher walks it with
xgrammar's pushdown automaton; EOS is allowed where the grammar may end.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from arbor.grammar.backends.pushdown import PushdownMatcher
from arbor.grammar.bitmask import VocabTables, set_bits
from arbor.grammar.jump_forward import MAX_JUMP_BYTES
from arbor.grammar.structural_tag import canonical
from arbor.grammar.vocabulary import TokenVocabulary

# Compact text with the separators the outlines backend writes (json_schema.py).
SEPARATORS = (", ", ": ")


def tokenizer_info_json(vocab: TokenVocabulary) -> bytes:
    """xgrammar's serialized TokenizerInfo for `vocab` (what the worker and the matchers load)."""
    import xgrammar

    encoded = [b if b is not None else b"" for b in vocab.token_bytes]
    info = xgrammar.TokenizerInfo(
        encoded, xgrammar.VocabType.RAW, vocab_size=vocab.logits_size, stop_token_ids=vocab.eos_ids
    )
    return info.serialize_json().encode()


def compile_source(compiler: Any, kind: str, text: str, regex: str) -> Any:
    """Compile one constraint with an xgrammar GrammarCompiler (in the worker). `regex` is
    Arbor's regex for `choices` (and the text itself for `regex`)."""
    if kind == "json_schema":
        return compiler.compile_json_schema(text, any_whitespace=False, separators=SEPARATORS)
    if kind == "json_object":
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, separators=SEPARATORS)
    if kind in ("regex", "choices"):
        return compiler.compile_regex(regex)
    if kind == "ebnf":
        return compiler.compile_grammar(text)
    if kind == "structural_tag":
        return compiler.compile_structural_tag(json.dumps(canonical(text)))
    raise ValueError(f"the xgrammar backend has no constraint kind {kind!r}")


class XgrammarGrammar:
    """A compiled xgrammar grammar, shared by the matchers of every request that uses it."""

    def __init__(self, serialized: bytes, info: Any, tables: VocabTables, unenforced: list[str]) -> None:
        import xgrammar

        self.compiled = xgrammar.CompiledGrammar.deserialize_json(serialized.decode(), info)
        self.tables = tables
        self.unenforced = unenforced
        self.size_bytes = self.compiled.memory_size_bytes

    def matcher(self, budget_aware: bool = False) -> XgrammarMatcher:
        """A fresh matcher; budget-aware closing needs the outlines backend's automaton."""
        return XgrammarMatcher(self)


class XgrammarMatcher(PushdownMatcher):
    """One request's walk through an XgrammarGrammar (the interface in backends/__init__.py)."""

    def __init__(self, grammar: XgrammarGrammar) -> None:
        import xgrammar

        super().__init__(grammar, xgrammar.GrammarMatcher(grammar.compiled))
        self._mask = np.zeros(grammar.tables.words, dtype=np.int32)
        self._mask_fresh = False  # `_mask` is the current state's (is_terminated wrote it)
        used = grammar.tables.vocab.logits_size % 32  # bits of the last word that are tokens
        self._last_word = np.uint32((1 << used) - 1 if used else 0xFFFFFFFF)

    def fill_bitmask(self, out: np.ndarray, remaining: int | None = None) -> None:
        """Write the allowed-token bitset of the current state into `out` (int32 words); the
        bits past the logits, which xgrammar may set, are cleared. A mask `is_terminated`
        just wrote for this state is copied, not computed again."""
        if self._mask_fresh:
            out[:] = self._mask
            return
        self._m.fill_next_token_bitmask(torch.from_numpy(out.reshape(1, -1)))
        out.view(np.uint32)[-1] &= self._last_word

    def accept_token(self, token: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar does not allow it."""
        if token in self._eos or not self._m.accept_token(token):
            return False
        self._mask_fresh = False
        return True

    def rollback(self, tokens: int) -> None:
        self._mask_fresh = False
        self._m.rollback(tokens)

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by all of `tokens`, or by none of them."""
        for n, tok in enumerate(tokens):
            if not self.accept_token(tok):
                if n:
                    self._m.rollback(n)
                return False
        return True

    def allows_end(self) -> bool:
        return self._m.is_completed()

    def is_terminated(self) -> bool:
        """The output is complete: only EOS may follow."""
        if not self._m.is_completed():
            return False
        if not self._mask_fresh:
            self.fill_bitmask(self._mask)
            self._mask_fresh = True
        others = self._mask.copy()
        set_bits(others, self.grammar.tables.eos_ids, on=False)
        return not others.any()

    def forced_bytes(self) -> bytes:
        """The text every valid continuation starts with (whole UTF-8 characters)."""
        return self._m.find_jump_forward_string().encode()[:MAX_JUMP_BYTES]
