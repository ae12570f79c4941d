"""Asynchronous execution engine at its promised import path, ``echo_rl.core.async_execution``.

Token-level dispatch, radix KV prefix cache, bandwidth-aware admission. The code lives in
:mod:`echo_rl.engine` (guide: docs/engine.md); this module only re-exports it so the documented
imports keep working. ``KVCacheManager`` here is the radix cache that can also be sized from an
:class:`ExecutionConfig` (:mod:`echo_rl.engine.cache_sizing`).
"""

from echo_rl.config import ExecutionConfig
from echo_rl.engine.cache_sizing import KVCacheManager, cache_capacity_tokens
from echo_rl.engine.engine import AsyncExecutionEngine, ContextLengthError, EngineClosedError, GenerationResult
from echo_rl.engine.sampling import SamplingParams
from echo_rl.engine.vllm_backend import VLLMExecutionEngine
from echo_rl.lm.session import EpisodeSession  # episode histories are the generator's (training)

__all__ = ["AsyncExecutionEngine", "ContextLengthError", "EngineClosedError", "EpisodeSession",
           "ExecutionConfig", "GenerationResult", "KVCacheManager", "SamplingParams",
           "VLLMExecutionEngine", "cache_capacity_tokens"]
