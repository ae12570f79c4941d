"""Rewarding Impact-Driven Exploration (Raileanu & Rocktaschel 2020, arXiv:2002.12292).

An embedding phi is trained with ICM's inverse + forward losses. The bonus
rewards actions that change the learned state representation, discounted by
how often the episode has already reached the new state:

    r_t = || phi(s_t+1) - phi(s_t) ||_2 / sqrt( N_ep(s_t+1) )

N_ep counts exact observations within the current episode (the first
observation of the episode included), so going back and forth between two
states stops paying.
"""

from __future__ import annotations

import numpy as np
import torch

from echo_rl.intrinsic.base import IntrinsicBase, seeded
from echo_rl.intrinsic.dynamics import DynamicsEmbedding


def _raw(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class RIDE(IntrinsicBase):
    _state_keys = ("episode_counts",)

    def __init__(self, observation_space, action_space, device="cpu", *, latent_dim: int = 128, hidden: int = 256,
                 lr: float = 1e-3, batch_size: int = 256, epochs: int = 1, forward_weight: float = 0.2,
                 seed: int = 0):
        super().__init__(observation_space, action_space, device)
        self.batch_size, self.epochs = int(batch_size), int(epochs)
        with seeded(seed):
            self.dynamics = DynamicsEmbedding(self.kind, self.obs_shape, self.action_dim, self.discrete,
                                              latent_dim=latent_dim, hidden=hidden, lr=lr, device=self.device,
                                              with_forward=True, forward_weight=forward_weight)
        self.generator = torch.Generator().manual_seed(seed)
        self._nets = self.dynamics.nets()
        self._optims = {"dynamics": self.dynamics.optimizer}
        self.episode_counts: list[dict[bytes, int]] | None = None  # one {observation bytes: visits} per env

    @torch.no_grad()
    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor:
        raw_obs, raw_next = _raw(obs), _raw(next_obs)
        obs, _, next_obs, dones = self._rollout(obs, actions, next_obs, dones)
        t_len, n = obs.shape[:2]
        if self.episode_counts is None:
            self.episode_counts = [{} for _ in range(n)]
        elif len(self.episode_counts) != n:
            raise ValueError(f"RIDE was run with {len(self.episode_counts)} envs and now gets {n}")
        impact = (self.dynamics.embed(next_obs) - self.dynamics.embed(obs)).norm(dim=-1)
        visits = np.empty((t_len, n), dtype=np.float32)
        done = dones.cpu().numpy()
        for t in range(t_len):
            for e in range(n):
                counts = self.episode_counts[e]
                if not counts:  # a new episode: its first observation counts as visited
                    counts[raw_obs[t, e].tobytes()] = 1
                key = raw_next[t, e].tobytes()
                counts[key] = counts.get(key, 0) + 1
                visits[t, e] = counts[key]
                if done[t, e]:
                    counts.clear()
        return (impact / torch.from_numpy(visits).to(self.device).sqrt()).float()

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]:
        obs, actions, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        return self.dynamics.train(obs, actions, next_obs, epochs=self.epochs, batch_size=self.batch_size,
                                   generator=self.generator)
