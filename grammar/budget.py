"""Budget-aware constrained decoding: from each state of a grammar's index, the fewest tokens
that reach a state where the output may end, and the tokens that get closer.

With R tokens of budget left, a request may only take tokens after which an end is at most
R - 1 tokens away; once R comes within the distance plus BUDGET_MARGIN, only tokens that
strictly shorten it (and EOS where the output may end). So a structured output always closes
before max_new_tokens cuts it off. Distances come from one backward breadth-first search over
the index's token transitions (in the compile worker); each state's per-token distances are
looked up the first time a request's budget limits it.
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np
import outlines_core

BUDGET_MARGIN = 4  # tokens of slack before closing starts (jump-forward may tokenize a few more)
UNREACHABLE = 1 << 30


class Distances:
    """Per state of one index: the fewest tokens to a state that allows the end (sentinel),
    and the largest such distance among its successors (`reach`: above it, no limit bites)."""

    def __init__(self, dist: dict[int, int], reach: dict[int, int]) -> None:
        self.dist = dist
        self.reach = reach
        self._next: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @classmethod
    def build(cls, index: outlines_core.Index, sentinel: int) -> Distances:
        """Backward breadth-first search from the states that allow the end (seconds for the
        largest grammars, so the compile worker runs it)."""
        back: defaultdict[int, set[int]] = defaultdict(set)
        succ: dict[int, set[int]] = {}
        ends = []
        for state, row in index.get_transitions().items():
            targets = set(row.values())
            if sentinel in row:
                ends.append(state)
                targets.discard(row[sentinel])
            succ[state] = targets
            for nxt in targets:
                back[nxt].add(state)
        dist = dict.fromkeys(ends, 0)
        queue = deque(ends)
        while queue:
            state = queue.popleft()
            step = dist[state] + 1
            for prev in back.get(state, ()):
                if prev not in dist:
                    dist[prev] = step
                    queue.append(prev)
        reach = {s: max((dist.get(n, UNREACHABLE) for n in targets), default=0) for s, targets in succ.items()}
        return cls(dist, reach)

    def to_bytes(self) -> bytes:
        rows = [(s, d, self.reach.get(s, 0)) for s, d in self.dist.items()]
        return np.array(rows, dtype=np.int64).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> Distances:
        rows = np.frombuffer(data, dtype=np.int64).reshape(-1, 3)
        states = rows[:, 0].tolist()
        return cls(dict(zip(states, rows[:, 1].tolist())), dict(zip(states, rows[:, 2].tolist())))

    def of(self, state: int) -> int:
        return self.dist.get(state, UNREACHABLE)

    def limit(self, state: int, remaining: int) -> int | None:
        """The largest distance a next state may have with `remaining` tokens left, or None
        when every allowed token keeps the output closable."""
        here = self.of(state)
        most = here - 1 if remaining <= here + BUDGET_MARGIN else remaining - 1
        return most if most < self.reach.get(state, UNREACHABLE) else None

    def limited(
        self, index: outlines_core.Index, state: int, row: np.ndarray, end: np.ndarray | None, most: int
    ) -> np.ndarray:
        """`row` (the state's mask) less every token whose next state is over `most` tokens from
        an end; `end` (EOS bits, where the output may end here) stays."""
        tokens, dnext = self._distances_after(index, state)
        keep = np.zeros(row.size * 32, dtype=bool)
        keep[tokens[(dnext <= most) & (tokens < keep.size)]] = True
        out = row & np.packbits(keep, bitorder="little").view("<i4")
        if end is not None:
            out |= end
        return out

    def _distances_after(self, index: outlines_core.Index, state: int) -> tuple[np.ndarray, np.ndarray]:
        """The state's allowed tokens and the distance after each (cached per state)."""
        found = self._next.get(state)
        if found is None:
            tokens = np.array(index.get_allowed_tokens(state), dtype=np.int64)
            dnext = np.array(
                [
                    self.of(n) if (n := index.get_next_state(state, t)) is not None else UNREACHABLE
                    for t in tokens.tolist()
                ],
                dtype=np.int64,
            )
            found = self._next[state] = (tokens, dnext)
        return found
