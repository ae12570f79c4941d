"""Exploration via Elliptical Episodic Bonuses (Henaff et al. 2022, arXiv:2210.05805).

An embedding phi is trained by inverse dynamics. Within an episode the bonus
for reaching s is its elliptical norm under the episode's feature covariance

    b(s) = phi(s)^T C^{-1} phi(s),    C = lambda * I + sum_{s_i earlier in the episode} phi(s_i) phi(s_i)^T

(lambda = ``ridge``), a count generalised to continuous features: it is large
along directions the episode has not covered yet. C^{-1} is kept per env and
updated in O(d^2) per step with Sherman-Morrison,
C^{-1} <- C^{-1} - u u^T / (1 + b), u = C^{-1} phi(s). Each episode starts
with C = lambda * I plus its first observation.
"""

from __future__ import annotations

import torch

from echo_rl.intrinsic.base import IntrinsicBase, seeded
from echo_rl.intrinsic.dynamics import DynamicsEmbedding


class E3B(IntrinsicBase):
    _state_keys = ("cov_inv", "fresh")

    def __init__(self, observation_space, action_space, device="cpu", *, latent_dim: int = 128, hidden: int = 256,
                 lr: float = 1e-3, batch_size: int = 256, epochs: int = 1, ridge: float = 0.1, seed: int = 0):
        super().__init__(observation_space, action_space, device)
        if ridge <= 0:
            raise ValueError(f"ridge={ridge} must be > 0")
        self.batch_size, self.epochs, self.ridge, self.latent_dim = int(batch_size), int(epochs), float(ridge), latent_dim
        with seeded(seed):
            self.dynamics = DynamicsEmbedding(self.kind, self.obs_shape, self.action_dim, self.discrete,
                                              latent_dim=latent_dim, hidden=hidden, lr=lr, device=self.device,
                                              with_forward=False)
        self.generator = torch.Generator().manual_seed(seed)
        self._nets = self.dynamics.nets()
        self._optims = {"dynamics": self.dynamics.optimizer}
        self.cov_inv: torch.Tensor | None = None  # (N, d, d), built on the first rollout
        self.fresh: torch.Tensor | None = None  # (N,) envs whose episode has not been seeded yet

    def _reset(self, envs: torch.Tensor) -> None:
        self.cov_inv[envs] = torch.eye(self.latent_dim, device=self.device) / self.ridge
        self.fresh[envs] = True

    def _observe(self, phi: torch.Tensor, envs: torch.Tensor | None = None) -> torch.Tensor:
        """Bonus of phi (n, d) for ``envs`` (all when None), then add phi to their covariance (Sherman-Morrison)."""
        c = self.cov_inv if envs is None else self.cov_inv[envs]
        u = torch.bmm(c, phi.unsqueeze(-1))  # (n, d, 1)
        b = (phi * u.squeeze(-1)).sum(-1)
        c_new = c - (u * u.transpose(1, 2)) / (1.0 + b)[:, None, None]
        if envs is None:
            self.cov_inv = c_new
        else:
            self.cov_inv[envs] = c_new
        return b

    @torch.no_grad()
    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor:
        obs, _, next_obs, dones = self._rollout(obs, actions, next_obs, dones)
        t_len, n = obs.shape[:2]
        if self.cov_inv is None or self.cov_inv.shape[0] != n:
            if self.cov_inv is not None:
                raise ValueError(f"E3B was run with {self.cov_inv.shape[0]} envs and now gets {n}")
            self.cov_inv = torch.empty(n, self.latent_dim, self.latent_dim, device=self.device)
            self.fresh = torch.ones(n, dtype=torch.bool, device=self.device)
            self._reset(torch.arange(n, device=self.device))
        phi, phi_next = self.dynamics.embed(obs), self.dynamics.embed(next_obs)
        bonus = torch.zeros(t_len, n, device=self.device)
        for t in range(t_len):
            if self.fresh.any():
                first = self.fresh.nonzero().squeeze(-1)
                self._observe(phi[t, first], first)
                self.fresh[first] = False
            bonus[t] = self._observe(phi_next[t])
            if dones[t].any():
                self._reset(dones[t].nonzero().squeeze(-1))
        return bonus.float()

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]:
        obs, actions, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        return self.dynamics.train(obs, actions, next_obs, epochs=self.epochs, batch_size=self.batch_size,
                                   generator=self.generator)
