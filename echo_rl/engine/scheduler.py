"""Admission order of waiting requests: bandwidth-aware priority or FIFO.

Priority (ARCHITECTURE §1.2) is ``r / (w_b * b_eff + w_q * q + eps)`` with
``b_eff = b(t) - b(t')`` for the prompt length t and the prefix t' the radix
cache holds *now*, and ``q`` the queueing cost ahead of the request: the b_eff
of every request that arrived earlier and still waits (bandwidth units, like
b_eff). Requests that are mostly cached go first (SGLang's longest-prefix-first
is the w_q = 0 case). Starvation: for equal r and ``w_q >= w_b`` an older
request always outranks a newer one (the newer one's q contains the older one's
whole b_eff), so nothing waits forever; ``w_q < w_b`` lets a request jump only
the requests at least ``1/(1 - w_q/w_b)`` times costlier than itself, and
``ExecutionConfig.timeout`` bounds the wait in every case.

:class:`BandwidthAwareScheduler` is the same rule in the product's form (a
:class:`BandwidthConfig`, seq_len / reuse_len names, checked lengths), for
ranking requests outside the engine; ``effective_bandwidth_cost(seq_len=128,
reuse_len=96)`` = 8256 - 4656 = **3600** is the cost both rank by.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from echo_rl.config import BandwidthConfig, ConfigError
from echo_rl.kernels import bandwidth as K
from echo_rl.kernels.bandwidth import (
    bandwidth_aware_priorities,
    effective_bandwidth_cost,
    queue_costs,
    schedule_priorities,
)


class RequestScheduler:
    """Orders waiting requests for admission."""

    def __init__(self, policy: str = "bandwidth", scale: float = 1.0, bandwidth_weight: float = 1.0,
                 queue_weight: float = 1.0, epsilon: float = 1e-6):
        if policy not in ("bandwidth", "fifo"):
            raise ValueError(f"policy={policy!r} is invalid: allowed: bandwidth, fifo")
        self.policy, self.scale = policy, scale
        self.bandwidth_weight, self.queue_weight, self.epsilon = bandwidth_weight, queue_weight, epsilon

    def b_eff(self, total: int, cached: int) -> float:
        return float(effective_bandwidth_cost(total, cached, self.scale))

    def priorities(self, totals: Sequence[int], cached: Sequence[int], rewards: Sequence[float]) -> np.ndarray:
        """Priorities of requests given in arrival order."""
        b = effective_bandwidth_cost(np.asarray(totals, float), np.asarray(cached, float), self.scale)
        b = np.atleast_1d(np.asarray(b, dtype=float))
        return bandwidth_aware_priorities(np.asarray(rewards, float), self.bandwidth_weight * b,
                                          self.queue_weight * queue_costs(b), self.epsilon)

    def order(self, waiting: list, totals: Callable, cached: Callable, rewards: Callable) -> list:
        """``waiting`` in arrival order -> dispatch order."""
        if self.policy == "fifo" or len(waiting) <= 1:
            return list(waiting)
        p = self.priorities([totals(r) for r in waiting], [cached(r) for r in waiting],
                            [rewards(r) for r in waiting])
        return [waiting[i] for i in schedule_priorities(p)]


def _check_lengths(seq_len, reuse_len) -> None:
    s, r = np.asarray(seq_len), np.asarray(reuse_len)
    if np.any(s < 0) or np.any(np.asarray(s) != np.floor(s)):
        raise ConfigError(f"seq_len={seq_len!r} is invalid: must be an integer >= 0")
    if np.any(r < 0) or np.any(r != np.floor(r)):
        raise ConfigError(f"reuse_len={reuse_len!r} is invalid: must be an integer >= 0")
    if np.any(r > s):
        raise ConfigError(f"reuse_len={reuse_len!r} is invalid: must be <= seq_len={seq_len!r}")


def attention_bandwidth_cost(seq_len: int, scale: float = 1.0) -> float:
    """``b(s_1:t) = scale * t(t+1)/2`` (a bad length is a ConfigError naming it)."""
    _check_lengths(seq_len, 0)
    return K.attention_bandwidth_cost(int(seq_len), scale)


def checked_effective_bandwidth_cost(seq_len, reuse_len=0, scale: float = 1.0):
    """``b(t) - b(t')`` for a reused prefix of ``reuse_len`` states; scalars or arrays; bad lengths are a
    ConfigError naming them (``echo_rl.core.bandwidth.effective_bandwidth_cost``)."""
    _check_lengths(seq_len, reuse_len)
    return K.effective_bandwidth_cost(seq_len, reuse_len, scale)


class BandwidthAwareScheduler:
    """Ranks requests by ``priority = r / (w * b_eff + q + eps)``: expected reward per unit of bandwidth.

    ``w`` is ``BandwidthConfig.bandwidth_weight`` (1: the engine's rule; 0: b_eff is ignored).

    ``queue_time`` is q in bandwidth units (not seconds: seconds do not add to b_eff). Pass ``None``
    for requests given in arrival order and q is the b_eff waiting ahead of each, as in the engine.
    """

    def __init__(self, config: BandwidthConfig | None = None):
        if config is not None and not isinstance(config, BandwidthConfig):
            raise ConfigError(f"config must be a BandwidthConfig, got {type(config).__name__}")
        self.config = config or BandwidthConfig()

    def compute_priority(self, reward: float, seq_len: int, queue_time: float = 0.0, reuse_len: int = 0) -> float:
        return float(self.compute_priorities([reward], [seq_len], [queue_time], [reuse_len])[0])

    def compute_priorities(self, rewards, seq_lens, queue_times=None, reuse_lens=None) -> np.ndarray:
        seq = np.asarray(seq_lens)
        reuse = np.zeros_like(seq) if reuse_lens is None else np.asarray(reuse_lens)
        if queue_times is not None and np.any(np.asarray(queue_times, dtype=float) < 0):
            raise ConfigError(f"queue_time={queue_times!r} is invalid: must be >= 0 (bandwidth units)")
        b_eff = checked_effective_bandwidth_cost(seq, reuse, self.config.scale)
        if queue_times is None:
            queue_times = queue_costs(b_eff)
        try:
            return bandwidth_aware_priorities(rewards, self.config.bandwidth_weight * np.asarray(b_eff, float),
                                              queue_times, self.config.epsilon)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def order(self, rewards, seq_lens, queue_times=None, reuse_lens=None, k: int | None = None) -> np.ndarray:
        """Indices to dispatch, highest priority first (ties: earlier request first)."""
        return schedule_priorities(self.compute_priorities(rewards, seq_lens, queue_times, reuse_lens), k)
