"""Reward scaling for the learner: rewards divided by the running std of the discounted return.

Why: a task whose rewards are large (Pendulum's are in [-16.3, 0] every step) gives returns
of hundreds, and the critic's regression and its clipped update (``value_clip``) work in
those units; the policy gradient, normalised per minibatch, does not care. Dividing by the
std of the discounted return (gymnasium's ``NormalizeReward``, what CleanRL's
``ppo_continuous_action.py`` wraps its envs in) brings the returns near unit scale without
moving their sign or their zero. It runs in the learner, after collection, so episode
statistics keep the task's rewards.
"""

from __future__ import annotations

import numpy as np

CLIP = 10.0  # scaled rewards are clipped to +-CLIP, as gymnasium's wrapper pair does in CleanRL


class RewardScaler:
    """Per-env discounted returns over the rollouts seen, their running variance, and the scaled rewards."""

    def __init__(self, num_envs: int, gamma: float, epsilon: float = 1e-8):
        self.gamma, self.epsilon = float(gamma), float(epsilon)
        self.returns = np.zeros(num_envs, dtype=np.float64)  # the discounted return of each env's episode so far
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def _update(self, x: np.ndarray) -> None:
        """Chan et al.'s parallel mean / variance update with a batch of returns."""
        b_mean, b_var, b_count = float(x.mean()), float(x.var()), x.size
        delta, total = b_mean - self.mean, self.count + b_count
        self.mean += delta * b_count / total
        self.var = (self.var * self.count + b_var * b_count + delta * delta * self.count * b_count / total) / total
        self.count = total

    def scale(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        """A (T, N) rollout's rewards / std(discounted return), the statistics updated with this rollout first;
        ``dones[t]`` (terminated or truncated) ends an env's episode after step t."""
        if rewards.shape != dones.shape or rewards.ndim != 2 or rewards.shape[1] != self.returns.shape[0]:
            raise ValueError(f"rewards {rewards.shape} and dones {dones.shape} must be (T, {self.returns.shape[0]})")
        seen = np.empty(rewards.shape, dtype=np.float64)
        for t in range(rewards.shape[0]):
            self.returns = self.gamma * self.returns + rewards[t]
            seen[t] = self.returns
            self.returns[dones[t]] = 0.0
        self._update(seen)
        scaled = rewards / np.sqrt(self.var + self.epsilon)
        return np.clip(scaled, -CLIP, CLIP).astype(rewards.dtype)

    def state_dict(self) -> dict:
        return {"returns": self.returns.tolist(), "mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        """The statistics always; the per-env returns where the env count matches (a resume). An agent with
        other envs (export, evaluation) starts its envs' returns at zero."""
        returns = np.asarray(state["returns"], dtype=np.float64)
        self.returns = returns if returns.shape == self.returns.shape else np.zeros_like(self.returns)
        self.mean, self.var, self.count = float(state["mean"]), float(state["var"]), float(state["count"])


__all__ = ["CLIP", "RewardScaler"]
