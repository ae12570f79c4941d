"""Radix-tree prefix cache over token ids, backed by a slot pool of KV tensors.

Why a radix tree (SGLang's RadixAttention) rather than hashed full blocks (vLLM's
prefix cache): agent histories grow by a few dozen tokens per turn, and a radix
tree matches at token granularity, so every turn reuses the whole previous
history instead of only its full blocks. Each token's K/V for every layer lives
in one *slot* of a preallocated pool; a tree node owns the slots of its edge.

Entries are salted by policy version: each version has its own root, so KV
computed by old weights is never matched after a weight update; stale unpinned
nodes are freed at once and pinned ones when their last user unpins them.
Eviction is LRU over unpinned leaves, under a slot budget derived from the
memory budget.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch


def _shared_prefix(edge, tokens, start: int, limit: int) -> int:
    """How many of ``edge``'s tokens equal ``tokens[start:limit]``, counted from the front."""
    n = 0
    for a, b in zip(edge, tokens[start:limit]):
        if a != b:
            break
        n += 1
    return n


@dataclass(eq=False)
class RadixNode:
    """One edge of the tree: ``tokens`` and the pool ``slots`` holding their KV."""

    tokens: tuple[int, ...] = ()
    slots: torch.Tensor | None = None
    parent: "RadixNode | None" = None
    children: dict[int, "RadixNode"] = field(default_factory=dict)
    ref_count: int = 0
    last_access: int = 0
    version: int = 0

    def __lt__(self, other: "RadixNode") -> bool:  # heap order for LRU eviction
        return self.last_access < other.last_access


@dataclass
class PrefixMatch:
    """A pinned cached prefix: release it with :meth:`KVCacheManager.release`."""

    length: int
    node: RadixNode
    slots: torch.Tensor
    version: int


class KVPool:
    """K and V of every layer, one row per slot: ``[slots, 2, layers, kv_heads, head_dim]``.

    Row-per-token layout so that handing a cached prefix to a sequence, or a
    finished sequence's tokens to the cache, is one ``index_select`` /
    ``index_copy_`` of whole rows. Grown by doubling up to ``max_slots``.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_slots: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 initial_slots: int = 1024):
        self.row_shape = (2, num_layers, num_kv_heads, head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.max_slots = int(max_slots)
        self.capacity = 0
        self.buf = torch.empty(0, *self.row_shape, dtype=dtype, device=self.device)
        self._free: list[int] = []
        self._grow(min(self.max_slots, initial_slots))

    @property
    def bytes_per_slot(self) -> int:
        n = 1
        for d in self.row_shape:
            n *= d
        return n * torch.tensor([], dtype=self.dtype).element_size()

    @property
    def capacity_bytes(self) -> int:
        """Bytes the pool has allocated (used or not): what counts against the memory budget."""
        return self.capacity * self.bytes_per_slot

    @property
    def num_free(self) -> int:
        return len(self._free) + (self.max_slots - self.capacity)

    @property
    def num_used(self) -> int:
        return self.capacity - len(self._free)

    def _grow(self, new_capacity: int) -> None:
        new_capacity = min(self.max_slots, new_capacity)
        if new_capacity <= self.capacity:
            return
        buf = torch.empty(new_capacity, *self.row_shape, dtype=self.dtype, device=self.device)
        buf[: self.capacity] = self.buf
        # Hand out low slots first: popping from the end of a descending list.
        self._free = list(range(new_capacity - 1, self.capacity - 1, -1)) + self._free
        self.buf, self.capacity = buf, new_capacity

    def alloc(self, n: int) -> torch.Tensor:
        if n > self.num_free:
            raise MemoryError(f"KV pool has {self.num_free} free slots, {n} requested")
        if n > len(self._free):
            self._grow(max(2 * self.capacity, self.capacity + n - len(self._free)))
        out = self._free[-n:][::-1] if n else []
        del self._free[len(self._free) - n:]
        return torch.tensor(out, dtype=torch.long, device=self.device)

    def free(self, slots: torch.Tensor) -> None:
        self._free.extend(slots.tolist())

    def shrink(self, target: int) -> torch.Tensor | None:
        """Reallocate to ``target`` slots (at least :attr:`num_used`), moving used slots above it down.

        Returns the old->new slot map when slots moved (the owner must renumber what it holds), else None.
        """
        target = int(target)
        if target >= self.capacity:
            return None
        if target < self.num_used:
            raise ValueError(f"cannot shrink the KV pool to {target} slots: {self.num_used} are in use")
        used = torch.ones(self.capacity, dtype=torch.bool)
        if self._free:
            used[torch.tensor(self._free, dtype=torch.long)] = False
        high = used[target:].nonzero().flatten() + target
        low_free = (~used[:target]).nonzero().flatten()
        mapping = None
        if len(high):
            dst = low_free[: len(high)]
            self.buf.index_copy_(0, dst.to(self.device), self.buf.index_select(0, high.to(self.device)))
            mapping = torch.arange(self.capacity)
            mapping[high] = dst
            used[dst] = True
        self.buf = self.buf[:target].clone()  # a new, smaller allocation; the old one is freed
        self._free = (~used[:target]).nonzero().flatten().flip(0).tolist()  # low slots handed out first
        self.capacity = target
        return mapping

    def write(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Store ``rows`` ``[n, 2, layers, kv_heads, head_dim]`` into ``slots``."""
        self.buf.index_copy_(0, slots, rows)

    def read(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rows of ``slots``; into ``out`` (contiguous, ``[len(slots), ...]``) when given."""
        if out is None:
            return self.buf.index_select(0, slots)
        return torch.index_select(self.buf, 0, slots, out=out)


class KVCacheManager:
    """Longest-prefix KV reuse with pinning, LRU eviction and version salting.

    ``max_tokens`` bounds the slots the tree may hold (the memory budget divided
    by the bytes one token's KV takes, capped by ``max_cache_size``). The engine
    lowers that bound at run time with :meth:`set_limit` while in-flight
    sequences need the rest of the budget for their working KV.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_tokens: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        if max_tokens < 0:
            raise ValueError(f"max_tokens={max_tokens!r} is invalid: must be >= 0")
        self.pool = KVPool(num_layers, num_kv_heads, head_dim, max_tokens, dtype, device)
        self.max_tokens = int(max_tokens)
        self.version = 0
        self._roots: dict[int, RadixNode] = {0: RadixNode(version=0, ref_count=1)}
        self._clock = itertools.count(1)
        self.evicted_tokens = 0
        self.inserted_tokens = 0

    # -- lookup ---------------------------------------------------------------
    def _root(self, version: int | None = None) -> RadixNode:
        v = self.version if version is None else version
        if v not in self._roots:
            self._roots[v] = RadixNode(version=v, ref_count=1)
        return self._roots[v]

    def match_length(self, tokens: list[int] | tuple[int, ...], limit: int | None = None) -> int:
        """Length of the cached prefix of ``tokens`` (no pinning, no LRU touch): for the scheduler."""
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        node, i = self._root(), 0
        while i < limit:
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = _shared_prefix(child.tokens, tokens, i, limit)
            i += n
            if n < len(child.tokens):
                break
            node = child
        return i

    def _split(self, node: RadixNode, at: int) -> RadixNode:
        """Cut ``node``'s edge after ``at`` tokens; returns the new upper node."""
        upper = RadixNode(tokens=node.tokens[:at], slots=node.slots[:at].clone(), parent=node.parent,
                          ref_count=node.ref_count, last_access=node.last_access, version=node.version)
        upper.children = {node.tokens[at]: node}
        node.parent.children[node.tokens[0]] = upper
        node.tokens, node.slots, node.parent = node.tokens[at:], node.slots[at:].clone(), upper
        return upper

    def match_and_pin(self, tokens: list[int] | tuple[int, ...], limit: int | None = None) -> PrefixMatch:
        """Longest cached prefix of ``tokens[:limit]``, pinned until :meth:`release`."""
        limit = len(tokens) if limit is None else min(limit, len(tokens))
        now = next(self._clock)
        node, i, parts = self._root(), 0, []
        while i < limit:
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = _shared_prefix(child.tokens, tokens, i, limit)
            if n == 0:
                break
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_access = now
            parts.append(child.slots)
            i += n
            node = child
        self._pin(node, +1)
        slots = torch.cat(parts) if parts else torch.empty(0, dtype=torch.long, device=self.pool.device)
        return PrefixMatch(length=i, node=node, slots=slots, version=node.version)

    # -- pins -----------------------------------------------------------------
    def _pin(self, node: RadixNode | None, delta: int) -> None:
        while node is not None and node.parent is not None:
            node.ref_count += delta
            node = node.parent

    def release(self, match: PrefixMatch) -> None:
        """Unpin a prefix; nodes of an outdated version are freed once nobody holds them."""
        self._pin(match.node, -1)
        if match.version != self.version:
            self._drop_stale(match.version)

    def pinned_tokens(self) -> int:
        """Tokens in nodes some in-flight sequence holds (0 when nothing runs)."""
        return sum(len(n.tokens) for n in self._nodes() if n.ref_count > 0 and n.parent is not None)

    # -- insert ---------------------------------------------------------------
    def insert(self, tokens: list[int] | tuple[int, ...], rows: torch.Tensor,
               version: int | None = None) -> int:
        """Cache ``tokens`` whose KV rows are ``rows`` ``[len(tokens), 2, layers, kv_heads, dim]``.

        Copies only tokens the tree lacks; under memory pressure evicts LRU leaves and, if still short,
        caches the longest prefix that fits. Returns the tokens cached now.
        A ``version`` other than the current one is not cached (stale KV).
        """
        v_ = self.version if version is None else version
        if v_ != self.version or self.max_tokens == 0:
            return 0
        now = next(self._clock)
        node, i = self._root(), 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            n = 0
            for a, b in zip(child.tokens, tokens[i:]):
                if a != b:
                    break
                n += 1
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_access = now
            i += n
            node = child
        if i >= len(tokens):
            return 0
        need = len(tokens) - i
        self._pin(node, +1)  # keep the attach point alive while evicting
        try:
            if self.pool.num_free < need:
                self.evict(need - self.pool.num_free)
            n = min(need, self.pool.num_free)
            if n == 0:
                return 0
            slots = self.pool.alloc(n)
            self.pool.write(slots, rows[i: i + n])
        finally:
            self._pin(node, -1)
        leaf = RadixNode(tokens=tuple(tokens[i: i + n]), slots=slots, parent=node, last_access=now,
                         version=v_)
        node.children[leaf.tokens[0]] = leaf
        self.inserted_tokens += n
        return n

    # -- eviction -------------------------------------------------------------
    def _nodes(self):
        stack = list(self._roots.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def _free_node(self, node: RadixNode) -> None:
        self.pool.free(node.slots)
        del node.parent.children[node.tokens[0]]
        self.evicted_tokens += len(node.tokens)

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots from unpinned leaves, least recently used first."""
        heap = [n for n in self._nodes() if n.parent is not None and not n.children and n.ref_count == 0]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            node = heapq.heappop(heap)
            parent = node.parent
            self._free_node(node)
            freed += len(node.tokens)
            if parent.parent is not None and not parent.children and parent.ref_count == 0:
                heapq.heappush(heap, parent)
        return freed

    def set_version(self, version: int) -> None:
        """Switch to KV computed by policy ``version``; drop what older weights computed."""
        if version == self.version:
            return
        old, self.version = self.version, int(version)
        self._root()
        self._drop_stale(old)

    def _drop_stale(self, version: int) -> None:
        root = self._roots.get(version)
        if root is None or version == self.version:
            return
        stack = [c for c in root.children.values()]
        order = []
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):  # children before parents
            if n.ref_count == 0 and not n.children:
                self._free_node(n)
        if not root.children:
            del self._roots[version]

    def clear(self) -> None:
        """Drop every unpinned entry, of all versions."""
        for v in [v for v in self._roots if v != self.version]:
            self._drop_stale(v)
        self.evict(self.pool.capacity + 1)

    # -- memory limit ---------------------------------------------------------
    @property
    def limit(self) -> int:
        """Slots the pool may hold now (``<= max_tokens``)."""
        return self.pool.max_slots

    def set_limit(self, max_tokens: int) -> bool:
        """Hold at most ``max_tokens`` slots (capped by ``max_tokens`` of the constructor).

        Lowering it evicts LRU entries and shrinks the pool's allocation; returns
        False, changing nothing, when pinned entries alone need more.
        """
        target = max(0, min(int(max_tokens), self.max_tokens))
        if target >= self.pool.capacity:
            self.pool.max_slots = target
            return True
        if self.pool.num_used > target:
            self.evict(self.pool.num_used - target)
            if self.pool.num_used > target:
                return False
        mapping = self.pool.shrink(target)
        self.pool.max_slots = target
        if mapping is not None:
            mapping = mapping.to(self.pool.device)
            for n in self._nodes():
                if n.parent is not None and len(n.slots):
                    n.slots = mapping[n.slots]
        return True

    def current_slots(self, match: PrefixMatch) -> torch.Tensor:
        """The slots of a pinned match now (a :meth:`set_limit` that shrank the pool renumbers slots)."""
        parts, node = [], match.node
        while node is not None and node.parent is not None:
            parts.append(node.slots)
            node = node.parent
        if not parts:
            return torch.empty(0, dtype=torch.long, device=self.pool.device)
        return torch.cat(parts[::-1])

    # -- accounting -----------------------------------------------------------
    @property
    def cached_tokens(self) -> int:
        return self.pool.num_used

    @property
    def memory_bytes(self) -> int:
        return self.pool.num_used * self.pool.bytes_per_slot

    def check_invariants(self) -> None:
        """Raise AssertionError if slots leak or are shared, or pins go negative (for tests)."""
        seen: set[int] = set()
        for n in self._nodes():
            if n.parent is None:
                continue
            assert n.ref_count >= 0, "negative pin count"
            assert len(n.tokens) == len(n.slots) > 0, "edge and slots disagree"
            assert n.parent.children.get(n.tokens[0]) is n, "broken parent link"
            s = set(n.slots.tolist())
            assert not (s & seen), "slot owned twice"
            seen |= s
        assert len(seen) == self.pool.num_used, f"{self.pool.num_used - len(seen)} slots leaked"
