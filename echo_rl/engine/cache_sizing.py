"""A radix KV cache sized by an :class:`ExecutionConfig`: the product's ``KVCacheManager(config=ExecutionConfig())``.

Why a module of its own: the engine builds its cache from a model's geometry
(:mod:`echo_rl.engine.radix_cache`); a caller without a model (a remote backend's prefix
bookkeeping, the documented example) needs the same cache sized from the config alone, under the
engine's own capacity rule.
"""

from __future__ import annotations

import torch

from echo_rl.config import ConfigError, ExecutionConfig
from echo_rl.engine.kv_budget import cache_tokens, kv_bytes_per_token
from echo_rl.engine.radix_cache import KVCacheManager as _RadixKVCache

__all__ = ["KVCacheManager", "cache_capacity_tokens"]


def cache_capacity_tokens(config: ExecutionConfig, num_layers: int, num_kv_heads: int, head_dim: int,
                          dtype: torch.dtype = torch.float32) -> int:
    """Tokens a radix cache may hold under ``config``: ``max_cache_size`` capped by ``kv_memory_budget_mb``
    divided by one token's K+V bytes (the engine's own rule). Without K/V rows (head_dim 0) only
    ``max_cache_size`` binds."""
    return cache_tokens(int(config.kv_memory_budget_mb * 2**20), config.max_cache_size,
                        kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype))


class KVCacheManager(_RadixKVCache):
    """The engine's radix-tree KV prefix cache (longest-prefix reuse, pinning, LRU eviction, versions).

    Two ways to build it:

    * ``KVCacheManager(num_layers, num_kv_heads, head_dim, max_tokens, dtype, device)`` — the
      engine's form, for a model's geometry;
    * ``KVCacheManager(config=ExecutionConfig(...))`` — sized by the config: it holds at most
      ``max_cache_size`` tokens (and no more than ``kv_memory_budget_mb`` of K/V when a geometry is
      given). Without a geometry it keeps token ids only (rows of size 0): the prefix bookkeeping a
      remote backend needs to know what it may reuse (``match_length``, ``insert``, ``evict``).
    """

    def __init__(self, num_layers: int = 1, num_kv_heads: int = 1, head_dim: int | None = None,
                 max_tokens: int | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", *, config: ExecutionConfig | None = None):
        if config is not None and not isinstance(config, ExecutionConfig):
            raise ConfigError(f"config must be an ExecutionConfig, got {type(config).__name__}")
        if head_dim is None:
            if config is None:
                raise ConfigError("KVCacheManager needs a model geometry (num_layers, num_kv_heads, head_dim, "
                                  "max_tokens) or config=ExecutionConfig(...)")
            head_dim = 0
        for name, v in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "head_dim" else 1):
                raise ConfigError(f"KVCacheManager.{name}={v!r} is invalid: must be an integer >= "
                                  f"{0 if name == 'head_dim' else 1}")
        if max_tokens is None:
            if config is None:
                raise ConfigError("KVCacheManager needs max_tokens or config=ExecutionConfig(...)")
            max_tokens = cache_capacity_tokens(config, num_layers, num_kv_heads, head_dim, dtype)
        elif config is not None and max_tokens > config.max_cache_size:
            raise ConfigError(f"KVCacheManager.max_tokens={max_tokens} is invalid: exceeds "
                              f"ExecutionConfig.max_cache_size={config.max_cache_size}")
        super().__init__(num_layers, num_kv_heads, head_dim, max_tokens, dtype, device)
        self.config = config
