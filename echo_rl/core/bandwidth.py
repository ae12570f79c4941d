"""Bandwidth accounting and bandwidth-aware scheduling at its promised import path, ``echo_rl.core.bandwidth``.

A compatibility module: the code lives where it is used. The η_bw tracker is
training's (:mod:`echo_rl.training.bandwidth`: the trainer owns it, rollouts and
learner updates feed it); the priority rule and the cost it ranks by are the
engine's admission order (:mod:`echo_rl.engine.scheduler`); the arithmetic is
:mod:`echo_rl.kernels.bandwidth`. Example (the product's):
``effective_bandwidth_cost(seq_len=128, reuse_len=96)`` = 8256 - 4656 = **3600**.
"""

from echo_rl.config import BandwidthConfig
from echo_rl.engine.scheduler import BandwidthAwareScheduler, attention_bandwidth_cost
from echo_rl.engine.scheduler import checked_effective_bandwidth_cost as effective_bandwidth_cost
from echo_rl.training.bandwidth import BandwidthEfficiencyTracker, BandwidthMetrics

__all__ = ["BandwidthConfig", "BandwidthEfficiencyTracker", "BandwidthAwareScheduler", "BandwidthMetrics",
           "attention_bandwidth_cost", "effective_bandwidth_cost"]
