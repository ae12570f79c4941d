"""Replay: schema'd ring storage; prioritized, uniform or FIFO sampling; hot/cold regions by age;
a samples-per-insert rate limiter."""

from echo_rl.core.replay.buffer import Batch, PrioritizedReplayBuffer, ReplayNotReadyError
from echo_rl.core.replay.hot_cold import HotColdBuffer
from echo_rl.core.replay.rate_limiter import RateLimited, RateLimiter, RateLimiterCancelled
from echo_rl.core.replay.samplers import SAMPLERS, Sampler
from echo_rl.core.replay.schema import Schema, SchemaError
from echo_rl.core.replay.surprise import SurpriseCalculator

__all__ = ["Batch", "HotColdBuffer", "PrioritizedReplayBuffer", "RateLimited", "RateLimiter", "RateLimiterCancelled",
           "ReplayNotReadyError", "SAMPLERS", "Sampler", "Schema", "SchemaError", "SurpriseCalculator"]
