"""The engine's one bound on KV memory: the radix cache's pool plus every running sequence's working buffer.

``ExecutionConfig.kv_memory_budget_mb`` bounds all KV the engine allocates.
The cache yields to working KV (it evicts LRU entries and shrinks its pool);
a request whose working buffer finds no room first gives up its cached prefix
(recomputing it needs no pinned rows), then waits for running sequences to
finish; one that cannot fit even alone is refused with an error naming the
budget.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from echo_rl.engine.radix_cache import KVCacheManager, PrefixMatch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K and V bytes one cached token takes across every layer."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()


def cache_tokens(budget_bytes: int, max_tokens: int, bytes_per_token: int) -> int:
    """The engine's cache capacity rule: ``max_tokens``, capped by what ``budget_bytes`` of K/V holds (token
    ids without K/V rows, ``bytes_per_token`` 0, are bound by ``max_tokens`` alone)."""
    return max_tokens if bytes_per_token == 0 else min(max_tokens, budget_bytes // bytes_per_token)


class KVBudget:
    """Owns the radix cache and sizes it by what the budget leaves after working KV."""

    def __init__(self, runner: Any, budget_mb: float, max_cache_tokens: int, device: torch.device) -> None:
        self.bytes_per_token = kv_bytes_per_token(len(runner.layers), runner.num_kv_heads, runner.head_dim,
                                                  runner.dtype)
        self.budget_bytes = int(budget_mb * 2**20)
        self.cache = KVCacheManager(len(runner.layers), runner.num_kv_heads, runner.head_dim,
                                    cache_tokens(self.budget_bytes, max_cache_tokens, self.bytes_per_token),
                                    runner.dtype, device)

    @staticmethod
    def working_bytes(running: Sequence[Any]) -> int:
        return sum(s.kv.nbytes for s in running)

    def held_bytes(self, running: Sequence[Any]) -> int:
        """All KV held now: the cache pool's allocation plus the working buffers."""
        return self.working_bytes(running) + self.cache.pool.capacity_bytes

    def fit_cache(self, running: Sequence[Any], extra: int = 0) -> bool:
        """Bound the cache by what the budget leaves after working KV (+ ``extra`` bytes about to be taken)."""
        room = self.budget_bytes - self.working_bytes(running) - extra
        return room >= 0 and self.cache.set_limit(room // self.bytes_per_token)

    def reserve(self, prompt: list[int], limit: int, need_bytes: int, running: Sequence[Any]) -> PrefixMatch | None:
        """Pin the prompt's cached prefix (up to ``limit`` tokens) and make room for ``need_bytes`` of working KV.

        The cache shrinks (LRU eviction) to make room. If pinned entries leave too little, the request
        retries without its cached prefix. None: no room now (the pins are released)."""
        match = self.cache.match_and_pin(prompt, limit)
        if self.fit_cache(running, need_bytes):
            match.slots = self.cache.current_slots(match)  # shrinking the pool may have moved them
            return match
        self.cache.release(match)
        match = self.cache.match_and_pin(prompt, 0)  # recompute the prefix rather than wait
        if self.fit_cache(running, need_bytes):
            return match
        self.cache.release(match)
        self.fit_cache(running)
        return None

    def snapshot(self, running: Sequence[Any]) -> dict[str, float]:
        working, pool = self.working_bytes(running), self.cache.pool.capacity_bytes
        return {"cache_tokens": float(self.cache.cached_tokens),
                "cache_memory_mb": self.cache.memory_bytes / 2**20,
                "cache_allocated_mb": pool / 2**20,
                "kv_working_mb": working / 2**20,
                "kv_memory_mb": (working + pool) / 2**20,
                "kv_budget_mb": self.budget_bytes / 2**20,
                "cache_evicted_tokens": float(self.cache.evicted_tokens),
                "cache_pinned_tokens": float(self.cache.pinned_tokens())}
