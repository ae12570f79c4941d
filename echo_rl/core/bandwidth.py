"""Bandwidth accounting and bandwidth-aware scheduling (ARCHITECTURE §1.5).

Attending over a context of t states costs ``b(t) = scale * t(t+1)/2``; reusing a
cached prefix of length t' leaves ``b_eff = b(t) - b(t')``. Example (the
product's): ``effective_bandwidth_cost(seq_len=128, reuse_len=96)`` =
8256 - 4656 = **3600**. Requests are ranked by ``r / (b_eff + q + eps)``, where q
is the queueing cost in bandwidth units: the b_eff of the requests waiting ahead
(``echo_rl.kernels.bandwidth.queue_costs``, the engine's definition too). A run
is judged by ``eta_bw = E[sum r] / (E[sum b_eff] + E_B[w * |l_PG|])``.
``BandwidthConfig.bandwidth_weight`` weights b_eff in the scheduler's
priority, ``r / (bandwidth_weight * b_eff + q + eps)``.

The arithmetic lives in :mod:`echo_rl.kernels.bandwidth`; this module keeps
the running totals and the product-facing names (seq_len / reuse_len).
"""

from __future__ import annotations

import math

import numpy as np

from echo_rl.config import BandwidthConfig, ConfigError
from echo_rl.kernels import bandwidth as K

__all__ = ["BandwidthConfig", "BandwidthEfficiencyTracker", "BandwidthAwareScheduler", "BandwidthMetrics",
           "attention_bandwidth_cost", "effective_bandwidth_cost"]


class BandwidthMetrics(dict):
    """A tracker snapshot: a flat ``dict[str, float]`` (the metrics contract) whose keys also read as
    attributes, so ``metrics.eta_bw`` and ``metrics["eta_bw"]`` are the same number."""

    def __getattr__(self, name: str) -> float:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no bandwidth metric {name!r}; have: {', '.join(self)}") from None


def _check_lengths(seq_len, reuse_len) -> None:
    s, r = np.asarray(seq_len), np.asarray(reuse_len)
    if np.any(s < 0) or np.any(np.asarray(s) != np.floor(s)):
        raise ConfigError(f"seq_len={seq_len!r} is invalid: must be an integer >= 0")
    if np.any(r < 0) or np.any(r != np.floor(r)):
        raise ConfigError(f"reuse_len={reuse_len!r} is invalid: must be an integer >= 0")
    if np.any(r > s):
        raise ConfigError(f"reuse_len={reuse_len!r} is invalid: must be <= seq_len={seq_len!r}")


def attention_bandwidth_cost(seq_len: int, scale: float = 1.0) -> float:
    """``b(s_1:t) = scale * t(t+1)/2``."""
    _check_lengths(seq_len, 0)
    return K.attention_bandwidth_cost(int(seq_len), scale)


def effective_bandwidth_cost(seq_len, reuse_len=0, scale: float = 1.0):
    """``b(t) - b(t')`` for a reused prefix of ``reuse_len`` states; scalars or arrays."""
    _check_lengths(seq_len, reuse_len)
    return K.effective_bandwidth_cost(seq_len, reuse_len, scale)


class BandwidthEfficiencyTracker:
    """Running bandwidth totals of a run and its live ``eta_bw``.

    Rollout steps accumulate into the current episode; ``episode_end=True`` (or
    :meth:`end_episode`) closes it. eta_bw averages over *finished* episodes;
    before the first one ends it is the ratio over the steps so far (the open
    episode), and NaN only while nothing at all has been recorded. Every
    episode end must reach the tracker (a step cap, a context cap, a win):
    an episode that is never closed is never counted.
    """

    def __init__(self, config: BandwidthConfig | None = None):
        if config is not None and not isinstance(config, BandwidthConfig):
            raise ConfigError(f"config must be a BandwidthConfig, got {type(config).__name__}")
        self.config = config or BandwidthConfig()
        self.reset()

    def reset(self) -> None:
        self._episode_rewards: list[float] = []
        self._episode_bandwidth: list[float] = []
        self._pg_losses: list[float] = []
        self._cur_reward = 0.0
        self._cur_bw = 0.0
        self.steps = 0
        self.total_tokens = 0
        self.reused_tokens = 0
        self.total_bandwidth = 0.0
        self.effective_bandwidth = 0.0

    def record_rollout_step(self, reward: float, seq_len: int, reuse_len: int = 0,
                            episode_end: bool = False) -> float:
        """Account one step whose context is ``seq_len`` long with ``reuse_len`` cached; returns its b_eff."""
        if not math.isfinite(float(reward)):
            raise ConfigError(f"reward={reward!r} is invalid: must be finite")
        scale = self.config.scale
        b_eff = effective_bandwidth_cost(seq_len, reuse_len, scale)
        self.total_bandwidth += attention_bandwidth_cost(seq_len, scale)
        self.effective_bandwidth += b_eff
        self.total_tokens += int(seq_len)
        self.reused_tokens += int(reuse_len)
        self.steps += 1
        self._cur_reward += float(reward)
        self._cur_bw += b_eff
        if episode_end:
            self.end_episode()
        return b_eff

    def end_episode(self) -> None:
        self._episode_rewards.append(self._cur_reward)
        self._episode_bandwidth.append(self._cur_bw)
        self._cur_reward = self._cur_bw = 0.0

    def record_learner_update(self, weighted_pg_loss: float) -> None:
        """One learner batch's policy-gradient loss (weighted by ``pg_loss_weight`` in eta_bw)."""
        if not math.isfinite(float(weighted_pg_loss)):
            raise ConfigError(f"weighted_pg_loss={weighted_pg_loss!r} is invalid: must be finite")
        self._pg_losses.append(float(weighted_pg_loss))

    def eta_bw(self) -> float:
        rewards, bandwidth = self._episode_rewards, self._episode_bandwidth
        if not rewards:
            if not self.steps:
                return float("nan")
            rewards, bandwidth = [self._cur_reward], [self._cur_bw]  # the open episode so far
        try:
            return K.bandwidth_efficiency(rewards, bandwidth, self._pg_losses or None, self.config.pg_loss_weight)
        except ValueError:  # nothing spent yet: the ratio is undefined
            return float("nan")

    def snapshot(self) -> BandwidthMetrics:
        saved = self.total_bandwidth - self.effective_bandwidth
        return BandwidthMetrics({
            "eta_bw": self.eta_bw(),
            "total_bandwidth": self.total_bandwidth,
            "effective_bandwidth": self.effective_bandwidth,
            "total_bandwidth_saved": saved,
            "bandwidth_saved_fraction": saved / self.total_bandwidth if self.total_bandwidth else float("nan"),
            "kv_reuse_rate": self.reused_tokens / self.total_tokens if self.total_tokens else float("nan"),
            "episodes": float(len(self._episode_rewards)),
            "steps": float(self.steps),
            "learner_updates": float(len(self._pg_losses)),
            "mean_episode_reward": float(np.mean(self._episode_rewards)) if self._episode_rewards else float("nan"),
        })


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
        b_eff = effective_bandwidth_cost(seq, reuse, self.config.scale)
        if queue_times is None:
            queue_times = K.queue_costs(b_eff)
        try:
            return K.bandwidth_aware_priorities(rewards, self.config.bandwidth_weight * np.asarray(b_eff, float),
                                                queue_times, self.config.epsilon)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def order(self, rewards, seq_lens, queue_times=None, reuse_lens=None, k: int | None = None) -> np.ndarray:
        """Indices to dispatch, highest priority first (ties: earlier request first)."""
        return K.schedule_priorities(self.compute_priorities(rewards, seq_lens, queue_times, reuse_lens), k)
