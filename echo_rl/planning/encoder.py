"""The trajectory encoder F_phi (window of the last k states -> plan distribution) and the actor's window ring.

Episode boundaries: a window carries a validity mask; states of an earlier
episode are zeroed *before* any computation, so they cannot leak into a plan.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from echo_rl.config import ConfigError, PlanningConfig
from echo_rl.planning.distribution import PlanDistribution

__all__ = ["LOG_STD_MAX", "LOG_STD_MIN", "StateWindow", "TrajectoryEncoder"]

LOG_STD_MIN, LOG_STD_MAX = -5.0, 1.0


def _check_positive(name: str, value: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name}={value!r} is invalid: must be an integer >= 1")


class TrajectoryEncoder(nn.Module):
    """Window of states ``[B, k, state_dim]`` + validity mask ``[B, k]`` -> plan distribution.

    Each state is embedded on its own, the embeddings of invalid (other-episode
    or padding) slots are zeroed and the mask itself is appended, so the plan is
    a function of the valid states only. Position is implicit in the flattened
    layout (slot k-1 is s_t).
    """

    def __init__(self, state_dim: int, config: PlanningConfig | None = None, hidden_dim: int = 128):
        super().__init__()
        config = config or PlanningConfig()
        _check_positive("state_dim", state_dim)
        _check_positive("hidden_dim", hidden_dim)
        self.state_dim = state_dim
        self.window = config.state_window_size
        self.latent_dim = config.embedding_dim
        self.embed = nn.Sequential(nn.Linear(state_dim, hidden_dim), nn.Tanh())
        self.body = nn.Sequential(nn.Linear(self.window * (hidden_dim + 1), hidden_dim), nn.Tanh())
        self.mean_head = nn.Linear(hidden_dim, self.latent_dim)
        self.log_std_head = nn.Linear(hidden_dim, self.latent_dim)
        nn.init.zeros_(self.log_std_head.weight)
        nn.init.constant_(self.log_std_head.bias, -1.0)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> PlanDistribution:
        self._check(states, mask, self.window)
        states = states * mask.to(states.dtype).unsqueeze(-1)  # invalid slots never enter (not even as NaN)
        return self.plan_from_embeddings(self.embed_states(states), mask)

    def embed_states(self, states: torch.Tensor) -> torch.Tensor:
        """Per-state embeddings ``[..., D] -> [..., hidden]``: a state's embedding does not depend on its
        window, so a caller with overlapping windows embeds each state once."""
        return self.embed(states)

    def plan_from_embeddings(self, h: torch.Tensor, mask: torch.Tensor) -> PlanDistribution:
        """Window of state embeddings ``[B, k, hidden]`` + mask ``[B, k]`` -> plan; invalid slots are zeroed."""
        m = mask.to(h.dtype).unsqueeze(-1)
        h = self.body(torch.cat([h * m, m], dim=-1).flatten(1))
        log_std = self.log_std_head(h).clamp(LOG_STD_MIN, LOG_STD_MAX)
        return PlanDistribution(self.mean_head(h), log_std)

    def consecutive(self, states: torch.Tensor, mask: torch.Tensor) -> tuple[PlanDistribution, PlanDistribution]:
        """Windows of k+1 states ``[B, k+1, D]`` -> (plan for slots 1..k, plan for slots 0..k-1).

        The two windows share k states, so each state is embedded once. ``mask`` is
        relative to the newest state's episode; the previous plan is only meaningful
        where ``mask[:, -2]`` holds (which is where the plan KL counts it).
        """
        self._check(states, mask, self.window + 1)
        h = self.embed_states(states)
        return self.plan_from_embeddings(h[:, 1:], mask[:, 1:]), self.plan_from_embeddings(h[:, :-1], mask[:, :-1])

    def _check(self, states: torch.Tensor, mask: torch.Tensor, width: int) -> None:
        if states.dim() != 3 or states.shape[1:] != (width, self.state_dim):
            raise ValueError(f"states must be [B, {width}, {self.state_dim}], got {tuple(states.shape)}")
        if mask.shape != states.shape[:2]:
            raise ValueError(f"mask must be {tuple(states.shape[:2])}, got {tuple(mask.shape)}")


class StateWindow:
    """Per-env ring of the last k states for acting; cleared at each episode start.

    ``push(states, episode_start)`` appends the newest states (``[N, state_dim]``)
    and returns ``(window [N, k, D], mask [N, k])`` with slot k-1 = newest.
    A state pushed with ``episode_start`` True invalidates every older slot.
    """

    def __init__(self, num_envs: int, state_dim: int, window: int):
        _check_positive("num_envs", num_envs)
        _check_positive("state_window_size", window)
        self.states = np.zeros((num_envs, window, state_dim), dtype=np.float32)
        self.mask = np.zeros((num_envs, window), dtype=bool)

    def push(self, states: np.ndarray, episode_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        start = np.asarray(episode_start, dtype=bool)
        self.states[:, :-1] = self.states[:, 1:]
        self.mask[:, :-1] = self.mask[:, 1:]
        self.states[:, -1] = states
        self.mask[:, -1] = True
        self.mask[start, :-1] = False
        self.states[start, :-1] = 0.0
        return self.states.copy(), self.mask.copy()
