"""Prioritized hot/cold replay at its promised import path, ``echo_rl.core.prioritized_replay``.

The code lives in :mod:`echo_rl.replay`; this module only re-exports it so the documented
imports keep working: ``ReplayConfig`` · ``PrioritizedReplayBuffer`` (one ring, proportional or
softmax priorities) · ``HotColdBuffer`` (hot/cold by age, the product's buffer) ·
``SurpriseCalculator`` (plan-surprise scores) · ``EMAPlanTracker`` ·
``Batch(data, indices, weights, probabilities)``.
"""

from echo_rl.config import ReplayConfig
from echo_rl.kernels import EMAPlanTracker
from echo_rl.replay.buffer import Batch, PrioritizedReplayBuffer
from echo_rl.replay.hot_cold import HotColdBuffer
from echo_rl.replay.samplers import ReplayNotReadyError
from echo_rl.replay.schema import Schema, SchemaError
from echo_rl.replay.surprise import SurpriseCalculator

__all__ = ["Batch", "EMAPlanTracker", "HotColdBuffer", "PrioritizedReplayBuffer", "ReplayConfig",
           "ReplayNotReadyError", "Schema", "SchemaError", "SurpriseCalculator"]
