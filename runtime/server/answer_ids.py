"""The token ids behind recent assistant answers, per tenant, bounded in bytes: the chat
tokenizer's memory (see chat.py for why it exists).

Keyed by (tenant, text): a chat splices only ids that its own tenant's requests produced, so
how a prompt tokenizes (and how fast) tells a tenant nothing of another tenant's answers.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import OrderedDict

MAX_BYTES = 32 << 20
ENTRY_OVERHEAD = 100  # bytes of the key tuple and the map's node, beside the text and the ids


class AnswerIds:
    """An LRU map (tenant, answer text) -> token ids whose entries sum to at most `max_bytes`."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[tuple[str | None, str], tuple[array, int]] = OrderedDict()
        self._lock = threading.Lock()  # chats are encoded on the event loop and the tokenizer thread

    def __len__(self) -> int:
        return len(self._items)

    def get(self, tenant: str | None, text: str) -> list[int] | None:
        with self._lock:
            item = self._items.get((tenant, text))
            if item is None:
                return None
            self._items.move_to_end((tenant, text))
            return item[0].tolist()

    def put(self, tenant: str | None, text: str, ids: list[int]) -> None:
        """Remember `ids` for `tenant`'s answer `text` (one larger than the whole bound is not kept)."""
        packed = array("i", ids)
        size = sys.getsizeof(text) + sys.getsizeof(packed) + ENTRY_OVERHEAD
        with self._lock:
            old = self._items.pop((tenant, text), None)
            if old is not None:
                self.nbytes -= old[1]
            if size > self.max_bytes:
                return
            self._items[(tenant, text)] = (packed, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                self.nbytes -= self._items.popitem(last=False)[1][1]
