"""What the xgrammar and llguidance matchers share: a library matcher (`_m`) that rolls back
any number of tokens, no budget-aware closing (that needs the outlines automaton's
distances), and EOS kept out of what they accept (the scheduler ends a request on EOS)."""

from __future__ import annotations

from typing import Any


class PushdownMatcher:
    """Base of XgrammarMatcher and LlguidanceMatcher; `_m` is the library's own matcher."""

    budget_aware = False

    def __init__(self, grammar: Any, matcher: Any) -> None:
        self.grammar = grammar
        self._m = matcher
        self._eos = set(grammar.tables.eos_ids.tolist())

    def distance(self) -> int:
        return 0

    def closing(self, remaining: int) -> bool:
        return False

    def rollback(self, tokens: int) -> None:
        self._m.rollback(tokens)
