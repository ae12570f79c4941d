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
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

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
