"""The llguidance backend (`--grammar-backend llguidance`): JSON schema, regex, EBNF/Lark,
structural tags.

llguidance builds its lexer and parser lazily and bounds every step with its own fuel
limits (LLParserLimits), and it drops the GIL while it works; so a grammar is built on the
compile service's thread (under the compile time limit) rather than in a worker process. One
template matcher per grammar is built and checked there; each request deep-copies it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from arbor.grammar.backends.pushdown import PushdownMatcher
from arbor.grammar.bitmask import VocabTables
from arbor.grammar.jump_forward import MAX_JUMP_BYTES
from arbor.grammar.structural_tag import canonical, to_lark
from arbor.grammar.vocabulary import TokenVocabulary

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # only its stub exports the TypedDict

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def make_tokenizer(vocab: TokenVocabulary, encode: Any) -> Any:
    """An LLTokenizer over Arbor's own token bytes (special tokens have none); `encode`
    turns text into ids (the Hugging Face tokenizer's)."""
    import llguidance

    return llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(_Source(vocab, encode)), n_vocab=vocab.logits_size, eos_token=vocab.eos_ids
    )


class _Source:
    """What llguidance's TokenizerWrapper reads: token bytes, special ids, EOS, an encoder."""

    def __init__(self, vocab: TokenVocabulary, encode: Any) -> None:
        self.eos_token_id = vocab.eos_ids[0] if vocab.eos_ids else 0
        self.bos_token_id = None
        self.tokens = [b if b is not None else b"" for b in vocab.token_bytes]
        self.special_token_ids = [i for i, b in enumerate(vocab.token_bytes) if b is None]
        self._encode = encode

    def __call__(self, text: str | bytes) -> list[int]:
        return self._encode(text if isinstance(text, str) else text.decode("utf-8", "replace"))


def grammar_text(kind: str, text: str, regex: str) -> str:
    """llguidance's grammar for one constraint; `regex` is Arbor's regex for `choices`."""
    import llguidance

    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=JSON_OPTIONS)
    if kind in ("regex", "choices"):
        return llguidance.LLMatcher.grammar_from_regex(regex)
    if kind == "ebnf":
        return llguidance.grammar_from("ebnf", text)
    if kind == "structural_tag":
        return llguidance.LLMatcher.grammar_from_lark(to_lark(canonical(text)))
    raise ValueError(f"the llguidance backend has no constraint kind {kind!r}")


class LlguidanceGrammar:
    """A checked llguidance grammar: the template matcher each request copies."""

    def __init__(self, tokenizer: Any, grammar: str, tables: VocabTables, unenforced: list[str]) -> None:
        import llguidance

        self.template = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if self.template.is_error():
            raise ValueError(self.template.get_error())
        self.tables = tables
        self.unenforced = unenforced
        self.size_bytes = len(grammar)

    def matcher(self, budget_aware: bool = False) -> LlguidanceMatcher:
        """A fresh matcher; budget-aware closing needs the outlines backend's automaton."""
        return LlguidanceMatcher(self)


class LlguidanceMatcher(PushdownMatcher):
    """One request's walk through an LlguidanceGrammar (the interface in backends/__init__.py).
    Tokens are offered with `try_consume_tokens`, which refuses without entering llguidance's
    error state."""

    def __init__(self, grammar: LlguidanceGrammar) -> None:
        super().__init__(grammar, grammar.template.deep_copy())

    def fill_bitmask(self, out: np.ndarray, remaining: int | None = None) -> None:
        """Write the allowed-token bitset of the current state into `out` (int32 words)."""
        self._m.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)

    def accept_token(self, token: int) -> bool:
        return token not in self._eos and self._m.try_consume_tokens([token]) == 1

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by all of `tokens`, or by none of them."""
        if any(t in self._eos for t in tokens):
            return False
        n = self._m.try_consume_tokens(tokens)
        if n < len(tokens):
            if n:
                self._m.rollback(n)
            return False
        return True

    def allows_end(self) -> bool:
        return self._m.is_accepting()

    def is_terminated(self) -> bool:
        """The output is complete: only EOS may follow."""
        return self._m.is_stopped()

    def forced_bytes(self) -> bytes:
        return self._m.compute_ff_bytes()[:MAX_JUMP_BYTES]
