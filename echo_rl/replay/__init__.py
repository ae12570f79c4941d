"""Replay: schema'd ring storage; prioritized, uniform or FIFO sampling; hot/cold regions by age;
a samples-per-insert rate limiter.

Modules: ``buffer`` (the ring, add and sample), ``priorities`` (leaf transform and updates),
``samplers``, ``hot_cold``, ``rate_limiter``, ``schema``, ``surprise`` (plan-surprise scores),
``experience`` (the product's ``add_experience`` / ``sample_batch``), ``persistence`` (save/load).
The documented import path ``echo_rl.core.prioritized_replay`` re-exports the product's part.
"""

from echo_rl.replay.buffer import Batch, PrioritizedReplayBuffer, ReplayNotReadyError
from echo_rl.replay.hot_cold import HotColdBuffer
from echo_rl.replay.rate_limiter import RateLimited, RateLimiter, RateLimiterCancelled
from echo_rl.replay.samplers import SAMPLERS, Sampler
from echo_rl.replay.schema import Schema, SchemaError
from echo_rl.replay.surprise import SurpriseCalculator

__all__ = ["Batch", "HotColdBuffer", "PrioritizedReplayBuffer", "RateLimited", "RateLimiter", "RateLimiterCancelled",
           "ReplayNotReadyError", "SAMPLERS", "Sampler", "Schema", "SchemaError", "SurpriseCalculator"]
