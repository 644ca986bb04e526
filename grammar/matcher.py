"""The contract between a compiled constraint and the scheduler: `CompiledConstraint` makes one
`Matcher` per request, and the scheduler walks it token by token.

Every backend implements it (outlines' `GrammarMatcher`, `XgrammarMatcher`,
`LlguidanceMatcher`), and `ReasoningGate` wraps any of them; tests/grammar/test_matcher_contract.py
drives each one through the same walk. Token ids are the model's; EOS is never accepted (the
scheduler ends a request on EOS where `allows_end` says it may).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from arbor.grammar.bitmask import VocabTables


@runtime_checkable
class Matcher(Protocol):
    """One request's position in its grammar."""

    budget_aware: bool  # masks may close the output early enough for the token budget
    grammar: CompiledConstraint

    def fill_bitmask(self, out: np.ndarray, remaining: int | None = None) -> None:
        """Write the allowed tokens as int32 bit words into `out` (`tables.words` long); with
        `remaining` tokens of budget and `budget_aware`, only tokens that keep the output
        closable within them."""
        ...

    def accept_token(self, token: int) -> bool:
        """Advance by one token; False (and no change) if the grammar forbids it."""
        ...

    def accept_tokens(self, tokens: list[int]) -> bool:
        """Advance by all of `tokens` or, returning False, by none."""
        ...

    def rollback(self, tokens: int) -> None:
        """Undo the last `tokens` accepted tokens (at least a jump-forward's worth)."""
        ...

    def distance(self) -> int:
        """Fewest tokens from here to an output that may end (0 where unknown)."""
        ...

    def closing(self, remaining: int) -> bool:
        """Whether `remaining` tokens are few enough that the output must close now."""
        ...

    def allows_end(self) -> bool:
        """Whether the output may end here (EOS is allowed)."""
        ...

    def is_terminated(self) -> bool:
        """Whether the output is complete: nothing but EOS may follow."""
        ...

    def forced_bytes(self) -> bytes:
        """The bytes every valid continuation starts with (jump-forward); empty if open."""
        ...


@runtime_checkable
class CompiledConstraint(Protocol):
    """A constraint compiled for one vocabulary; shared by every request that uses it."""

    tables: VocabTables
    unenforced: list[str]  # schema keywords the masks do not enforce (checked after generation)

    def matcher(self, budget_aware: bool = False) -> Matcher:
        """A fresh matcher at the grammar's start."""
        ...
