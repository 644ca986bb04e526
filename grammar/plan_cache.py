"""The cache of regex plans (a constraint's regex and unenforced keywords), bounded in bytes.

A plan is computed when a request is validated, before anyone knows whether the request
will run: it enters a small probation area, and moves to the kept area only when its request
ran (`keep`). Requests that are refused (a constraint that does not compile in time, a prompt
too long, a full server) can churn the probation area but never evict kept plans.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

from arbor.grammar.json_schema import RegexPlan

if TYPE_CHECKING:
    from arbor.grammar.constraint import Constraint

KEPT_BYTES = 64 << 20
PROBATION_BYTES = 16 << 20  # above the largest plan (a 2M-character regex and its 200k-character key)


class BytesLRU:
    """An LRU map of plans whose sizes sum to at most `max_bytes` (a larger plan is not kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[Constraint, tuple[RegexPlan, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Constraint) -> RegexPlan | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: Constraint, plan: RegexPlan) -> None:
        self.pop(key)
        size = plan_bytes(key, plan)
        if size > self.max_bytes:
            return
        self._items[key] = (plan, size)
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            self.nbytes -= self._items.popitem(last=False)[1][1]

    def pop(self, key: Constraint) -> RegexPlan | None:
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.nbytes -= item[1]
        return item[0]


class PlanCache:
    """Plans by constraint: `trial` when a request is validated, `keep` once it ran."""

    def __init__(self, kept_bytes: int = KEPT_BYTES, probation_bytes: int = PROBATION_BYTES) -> None:
        self.kept = BytesLRU(kept_bytes)
        self.probation = BytesLRU(probation_bytes)
        self._lock = threading.Lock()  # the server validates on its event loop and its tokenizer thread

    def get(self, key: Constraint) -> RegexPlan | None:
        with self._lock:
            return self.kept.get(key) or self.probation.get(key)

    def trial(self, key: Constraint, plan: RegexPlan) -> RegexPlan:
        """Hold a just-computed plan on probation; returns it."""
        with self._lock:
            if self.kept.get(key) is None:
                self.probation.put(key, plan)
        return plan

    def keep(self, key: Constraint) -> None:
        """The request constrained by `key` ran: keep its plan (if it is still on probation)."""
        with self._lock:
            plan = self.probation.pop(key)
            if plan is not None:
                self.kept.put(key, plan)

    @property
    def nbytes(self) -> int:
        return self.kept.nbytes + self.probation.nbytes


def plan_bytes(key: Constraint, plan: RegexPlan) -> int:
    """Memory an entry holds: its key's source text, the regex and the unenforced keywords."""
    return sys.getsizeof(key.text) + sys.getsizeof(plan.regex) + sum(sys.getsizeof(u) for u in plan.unenforced)
