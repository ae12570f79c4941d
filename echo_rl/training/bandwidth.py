"""η_bw accounting of a training run: rewards against the attention bandwidth their rollouts cost.

``eta_bw = E[sum r] / (E[sum b_eff] + E_B[w * |l_PG|])`` (ARCHITECTURE §1.5) needs
rewards, which only training knows, and the cost of every rollout step, which
the engine reports per request (``GenerationResult.prompt_length`` and
``cached_length``). So the tracker lives here, owned by the trainer: the LM
generator records each turn from the engine's result and closes each episode,
the learner records each update's policy-gradient loss. The cost is the
engine's, ``b_eff = b(t) - b(t')`` with ``b(t) = scale * t(t+1)/2``
(:mod:`echo_rl.engine.scheduler`, arithmetic in :mod:`echo_rl.kernels.bandwidth`).
"""

from __future__ import annotations

import math

import numpy as np

from echo_rl.config import BandwidthConfig, ConfigError
from echo_rl.engine.scheduler import attention_bandwidth_cost
from echo_rl.engine.scheduler import checked_effective_bandwidth_cost as effective_bandwidth_cost
from echo_rl.kernels import bandwidth as K

__all__ = ["BandwidthEfficiencyTracker", "BandwidthMetrics"]


class BandwidthMetrics(dict):
    """A tracker snapshot: a flat ``dict[str, float]`` (the metrics contract) whose keys also read as
    attributes, so ``metrics.eta_bw`` and ``metrics["eta_bw"]`` are the same number."""

    def __getattr__(self, name: str) -> float:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no bandwidth metric {name!r}; have: {', '.join(self)}") from None


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
