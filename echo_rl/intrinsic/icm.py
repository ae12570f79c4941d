"""Intrinsic Curiosity Module (Pathak et al. 2017, arXiv:1705.05363).

An embedding phi is trained by an inverse model (predict a_t from phi(s_t),
phi(s_t+1)) so it keeps what the agent controls; a forward model predicts
phi(s_t+1) from phi(s_t) and a_t. The bonus is the forward model's surprise

    r_t = eta / 2 * || f(phi(s_t), a_t) - phi(s_t+1) ||^2

and the module's loss is (1 - beta) * L_inverse + beta * L_forward with the
paper's beta = 0.2 (``forward_weight``).
"""

from __future__ import annotations

import torch

from echo_rl.intrinsic.base import IntrinsicBase, seeded
from echo_rl.intrinsic.dynamics import DynamicsEmbedding


class ICM(IntrinsicBase):
    def __init__(self, observation_space, action_space, device="cpu", *, latent_dim: int = 128, hidden: int = 256,
                 lr: float = 1e-3, batch_size: int = 256, epochs: int = 1, forward_weight: float = 0.2,
                 eta: float = 1.0, seed: int = 0):
        super().__init__(observation_space, action_space, device)
        self.batch_size, self.epochs, self.eta = int(batch_size), int(epochs), float(eta)
        with seeded(seed):
            self.dynamics = DynamicsEmbedding(self.kind, self.obs_shape, self.action_dim, self.discrete,
                                              latent_dim=latent_dim, hidden=hidden, lr=lr, device=self.device,
                                              with_forward=True, forward_weight=forward_weight)
        self.generator = torch.Generator().manual_seed(seed)
        self._nets = self.dynamics.nets()
        self._optims = {"dynamics": self.dynamics.optimizer}

    @torch.no_grad()
    def compute(self, obs, actions, next_obs, dones) -> torch.Tensor:
        obs, actions, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        phi, phi_next = self.dynamics.embed(obs), self.dynamics.embed(next_obs)
        pred = self.dynamics.forward(phi, actions)
        return (self.eta / 2 * (pred - phi_next).pow(2).sum(-1)).float()

    def update(self, obs, actions, next_obs, dones) -> dict[str, float]:
        obs, actions, next_obs, _ = self._rollout(obs, actions, next_obs, dones)
        return self.dynamics.train(obs, actions, next_obs, epochs=self.epochs, batch_size=self.batch_size,
                                   generator=self.generator)
