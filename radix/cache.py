"""RadixCache: shared prefixes of token sequences mapped to KV slots, with LRU eviction."""

from __future__ import annotations

from array import array
from collections import deque
from heapq import heapify, heappop, heappush

from arbor.radix.key import TOKEN_BYTES, TokenIds, common_prefix_bytes, to_key, to_values
from arbor.radix.node import TreeNode
from arbor.radix.prefix_cache import CacheStats, FreeFn, MatchResult, PrefixCache


class RadixCache(PrefixCache):
    """Token-level radix tree of KV slots; keys are cached in whole pages of `page_size`.

    Implements `PrefixCache` (its docstring states the locking and slot-ownership contract);
    eviction goes leaf by leaf in LRU order.
    """

    def __init__(self, page_size: int = 1) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self._page_bytes = page_size * TOKEN_BYTES
        self.reset()

    def reset(self) -> None:
        """Forget every cached sequence (the caller owns freeing their slots) and the stats."""
        self._clock = 0
        self._roots: dict[str | None, TreeNode] = {None: self._new_root()}
        self._root_salts: dict[int, str] = {}
        self._detached = self._new_root()  # the last_node of a salt with nothing cached
        # Evictable leaves in LRU order, as (stamp, node) entries checked lazily when they
        # reach the front: a leaf stamped now is appended to the `_recent_*` pair of queues
        # (stamps only grow, so they stay sorted; two queues, not one of tuples, to spare an
        # allocation per access); one that becomes evictable with an older stamp (unlocked,
        # or its last child evicted) goes into the `_late` heap. An entry is live while its
        # node is an unlocked leaf in the tree with that same stamp.
        self._recent_stamps: deque[int] = deque()
        self._recent_nodes: deque[TreeNode] = deque()
        self._late: list[tuple[int, int, TreeNode]] = []
        self._entry_limit = 1024
        self._num_nodes = 0
        self._evictable = 0
        self._protected = 0
        self._total = 0
        self.stats = CacheStats()

    @property
    def enabled(self) -> bool:
        """Always: the tree caches every whole page it is given."""
        return True

    # ----------------------------------------------------------------- queries

    def match_prefix(self, key: TokenIds, cache_salt: str | None = None) -> MatchResult:
        """Longest cached prefix of `key`, in whole pages; refreshes LRU time along the path.

        A match that ends inside an edge splits it, so `last_node` covers exactly the match.
        """
        key = to_key(key)
        stats = self.stats
        stats.queries += 1
        stats.query_tokens += len(key) // TOKEN_BYTES
        root = self._roots.get(cache_salt)
        if root is None:
            return MatchResult(array("i"), self._detached, 0)
        node, values, length = self._walk(root, key)
        stats.hit_tokens += length
        if not node.children and not node.lock_ref and node.parent is not None:
            self._touched(node)
        indices = array("i")
        for value in values:
            indices += value
        return MatchResult(indices, node, length)

    def insert(self, key: TokenIds, indices: array[int] | TokenIds, cache_salt: str | None = None) -> int:
        """Add `key` -> `indices` and return how many leading tokens were already cached.

        With page_size > 1 only whole pages are cached; the unaligned tail stays the caller's.
        """
        key = to_key(key)
        if len(key) // TOKEN_BYTES != len(indices):
            raise ValueError(f"insert needs one slot per token: {len(key) // TOKEN_BYTES} tokens, {len(indices)} slots")
        root = self._roots.get(cache_salt)
        if root is None:
            root = self._add_root(cache_salt)
        node, _, matched = self._walk(root, key)
        end = len(indices) - len(indices) % self.page_size
        if matched < end:
            start = matched * TOKEN_BYTES
            leaf = TreeNode(
                node,
                key[start : start + self._page_bytes],
                key[start : end * TOKEN_BYTES],
                to_values(indices[matched:end]),
                self._clock,
            )
            node.children[leaf.edge] = leaf
            self._num_nodes += 1
            self._evictable += end - matched
            self._total += end - matched
            node = leaf
        if not node.children and not node.lock_ref and node.parent is not None:
            self._touched(node)
        return matched

    def cacheable_len(self, num_tokens: int) -> int:
        """Whole pages: the unaligned tail of an insert stays the caller's."""
        return num_tokens - num_tokens % self.page_size

    # ------------------------------------------------------------ lock, evict

    def lock(self, node: TreeNode) -> None:
        """Protect the path from `node` to its root against eviction (reference counted)."""
        moved = 0
        while node.parent is not None:
            if node.lock_ref == 0:
                moved += len(node.value)
            node.lock_ref += 1
            node = node.parent
        self._evictable -= moved
        self._protected += moved

    def unlock(self, node: TreeNode) -> None:
        """Undo one `lock(node)`; a path no request holds becomes evictable again."""
        if node.parent is not None and node.lock_ref <= 0:
            raise RuntimeError(f"unlock of {node!r}, which is not locked")
        bottom, moved = node, 0
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                moved += len(node.value)
            node = node.parent
        self._evictable += moved
        self._protected -= moved
        if bottom.parent is not None and not bottom.lock_ref and not bottom.children:
            self._became_evictable(bottom)

    def evict(self, num_tokens: int, free_fn: FreeFn) -> int:
        """Free least-recently-used unlocked leaves until `num_tokens` are freed or none is left.

        Calls `free_fn` once with all freed slot indices; returns how many were freed.
        """
        stamps, nodes, late = self._recent_stamps, self._recent_nodes, self._late
        freed = 0
        slots = array("i")
        while freed < num_tokens:
            while nodes and not _live(stamps[0], nodes[0]):
                stamps.popleft()
                nodes.popleft()
            while late and not _live(late[0][0], late[0][2]):
                heappop(late)
            if late and (not nodes or late[0][0] < stamps[0]):
                node = heappop(late)[2]
            elif nodes:
                stamps.popleft()
                node = nodes.popleft()
            else:
                break
            parent = node.parent
            assert parent is not None  # a live LRU entry is a leaf in the tree
            slots += node.value
            freed += len(node.value)
            del parent.children[node.edge]
            node.parent = None
            self._num_nodes -= 1
            if not parent.children and not parent.lock_ref:
                if parent.parent is not None:
                    self._became_evictable(parent)
                elif parent.uid in self._root_salts:
                    del self._roots[self._root_salts.pop(parent.uid)]
        self._evictable -= freed
        self._total -= freed
        if slots:
            free_fn(slots)
        return freed

    # ------------------------------------------------------------------ sizes

    def evictable_size(self) -> int:
        """Cached tokens that no running request holds."""
        return self._evictable

    def protected_size(self) -> int:
        """Cached tokens on locked paths."""
        return self._protected

    def total_size(self) -> int:
        """All cached tokens (each owns one KV slot)."""
        return self._total

    def num_nodes(self) -> int:
        """Nodes in the tree, roots excluded."""
        return self._num_nodes

    def roots(self) -> dict[str | None, TreeNode]:
        """The root of each cache_salt namespace that holds something (None: no salt)."""
        return dict(self._roots)

    # ------------------------------------------------------------------ debug

    def dump(self, max_tokens: int = 8) -> str:
        """A readable tree: each edge's first tokens, length, lock count and last access."""
        lines = [
            f"RadixCache(page_size={self.page_size}, total={self._total}, "
            f"evictable={self._evictable}, protected={self._protected}, nodes={self._num_nodes})"
        ]
        for salt, root in self._roots.items():
            lines.append(f"salt={salt!r}")
            stack = [(child, 1) for child in reversed(list(root.children.values()))]
            while stack:
                node, depth = stack.pop()
                tokens = array("i", node.key[: max_tokens * TOKEN_BYTES]).tolist()
                more = "..." if len(node.value) > max_tokens else ""
                lines.append(
                    f"{'  ' * depth}{tokens}{more} len={len(node.value)} lock={node.lock_ref} t={node.last_access}"
                )
                stack.extend((child, depth + 1) for child in reversed(list(node.children.values())))
        return "\n".join(lines)

    def check_integrity(self) -> None:
        """Recount everything from the tree itself; raise RuntimeError on any mismatch."""
        evictable = protected = nodes = 0
        seen: set[int] = set()
        recent = list(zip(self._recent_stamps, self._recent_nodes))
        _expect(list(self._recent_stamps) == sorted(self._recent_stamps), "recent LRU entries out of order")
        tracked = {id(node) for stamp, node in recent if _live(stamp, node)}
        tracked.update(id(node) for stamp, _, node in self._late if _live(stamp, node))
        for root in self._roots.values():
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                nodes += 1
                n = len(node.value)
                _expect(n > 0 and n % self.page_size == 0, f"{node!r}: edge not whole pages")
                _expect(len(node.key) == n * TOKEN_BYTES, f"{node!r}: key and value lengths differ")
                _expect(node.edge == node.key[: self._page_bytes], f"{node!r}: edge is not its first page")
                parent = node.parent
                _expect(parent is not None and parent.children.get(node.edge) is node, f"{node!r}: bad parent link")
                below = sum(child.lock_ref for child in node.children.values())
                _expect(node.lock_ref >= below, f"{node!r}: lock_ref below its children's")
                _expect(not seen.intersection(node.value), f"{node!r}: a slot is cached twice")
                seen.update(node.value)
                if node.lock_ref:
                    protected += n
                else:
                    evictable += n
                    _expect(bool(node.children) or id(node) in tracked, f"{node!r}: evictable leaf not tracked")
                stack.extend(node.children.values())
        _expect(nodes == self._num_nodes, f"node count {self._num_nodes} != {nodes}")
        _expect(evictable == self._evictable, f"evictable_size {self._evictable} != {evictable}")
        _expect(protected == self._protected, f"protected_size {self._protected} != {protected}")
        _expect(evictable + protected == self._total, f"total_size {self._total} != {evictable + protected}")

    # --------------------------------------------------------------- internals

    def _new_root(self) -> TreeNode:
        return TreeNode(None, b"", b"", array("i"), 0)

    def _add_root(self, salt: str | None) -> TreeNode:
        root = self._roots[salt] = self._new_root()
        if salt is not None:
            self._root_salts[root.uid] = salt
        return root

    def _walk(self, node: TreeNode, key: bytes) -> tuple[TreeNode, list[array[int]], int]:
        """Follow `key` down from `node`, stamping the path; split where the match ends mid-edge.

        Returns the deepest matched node, the slot arrays along the path, and the length.
        """
        self._clock += 1
        now = node.last_access = self._clock
        page = self._page_bytes
        end = len(key) - len(key) % page
        pos = 0
        values: list[array[int]] = []
        while pos < end:
            child = node.children.get(key[pos : pos + page])
            if child is None:
                break
            edge_key = child.key
            if key[pos : pos + len(edge_key)] == edge_key:
                child.last_access = now
                values.append(child.value)
                pos += len(edge_key)
                node = child
                continue
            matched = common_prefix_bytes(key, pos, edge_key)
            matched -= matched % page  # >= one page: the child dict matched the first one
            node = self._split(child, matched // TOKEN_BYTES)
            node.last_access = now  # the suffix keeps its own time (and its LRU heap entry)
            values.append(node.value)
            pos += matched
            break
        return node, values, pos // TOKEN_BYTES

    def _split(self, child: TreeNode, tokens: int) -> TreeNode:
        """Cut `child`'s edge after `tokens`; the new prefix node takes its place.

        `child` keeps the suffix (and its identity), so lock handles stay valid.
        """
        cut = tokens * TOKEN_BYTES
        parent = child.parent
        assert parent is not None
        prefix = TreeNode(parent, child.edge, child.key[:cut], child.value[:tokens], child.last_access)
        prefix.lock_ref = child.lock_ref
        parent.children[child.edge] = prefix
        child.key = child.key[cut:]
        child.value = child.value[tokens:]
        child.edge = child.key[: self._page_bytes]
        child.parent = prefix
        prefix.children[child.edge] = child
        self._num_nodes += 1
        return prefix

    def _touched(self, node: TreeNode) -> None:
        """An evictable leaf was just stamped now: it is the most recently used."""
        self._recent_stamps.append(node.last_access)
        self._recent_nodes.append(node)
        if len(self._recent_nodes) > self._entry_limit:
            self._compact()

    def _became_evictable(self, node: TreeNode) -> None:
        """Track a leaf that just became evictable, keeping the LRU order exact."""
        if node.last_access == self._clock:
            self._touched(node)
            return
        heappush(self._late, (node.last_access, node.uid, node))
        if len(self._late) > self._entry_limit:
            self._compact()

    def _compact(self) -> None:
        """Drop dead and duplicate LRU entries in place; amortized O(1) per entry."""
        pairs = zip(self._recent_stamps, self._recent_nodes)
        recent = {id(node): (stamp, node) for stamp, node in pairs if _live(stamp, node)}
        self._recent_stamps.clear()
        self._recent_stamps.extend(stamp for stamp, _ in recent.values())
        self._recent_nodes.clear()
        self._recent_nodes.extend(node for _, node in recent.values())
        late = {id(e[2]): e for e in self._late if _live(e[0], e[2]) and id(e[2]) not in recent}
        self._late[:] = late.values()
        heapify(self._late)
        self._entry_limit = 2 * (len(self._recent_nodes) + len(self._late)) + 1024


def _live(stamp: int, node: TreeNode) -> bool:
    """Whether an LRU entry still names an evictable leaf as of that access."""
    return node.parent is not None and not node.children and not node.lock_ref and node.last_access == stamp


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(f"radix integrity: {message}")
