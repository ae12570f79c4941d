"""The plan distribution p_phi(tau | s) (a diagonal Gaussian) and the KL between consecutive plans.

Why a module of its own: the vector agent's encoder and the language model's planner
(``echo_rl.lm.plan``) both produce these distributions and both regularise
``L_KL = KL[p(tau_t | s_1:t) || p(tau_{t-1} | s_1:t-1)]``, so the distribution and its KL have no
network in them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PlanDistribution", "consecutive_plan_kl", "gaussian_kl"]


@dataclass
class PlanDistribution:
    """Diagonal Gaussian over plans; ``mean`` and ``log_std`` are ``[..., latent_dim]``."""

    mean: torch.Tensor
    log_std: torch.Tensor

    @property
    def std(self) -> torch.Tensor:
        return self.log_std.exp()

    def rsample(self, eps: torch.Tensor | None = None) -> torch.Tensor:
        """Reparameterised sample; pass the stored ``eps`` to reproduce an actor's plan."""
        if eps is None:
            eps = torch.randn_like(self.mean)
        return self.mean + self.std * eps

    def __getitem__(self, idx) -> "PlanDistribution":
        return PlanDistribution(self.mean[idx], self.log_std[idx])


def gaussian_kl(p: PlanDistribution, q: PlanDistribution) -> torch.Tensor:
    """KL[p || q] between diagonal Gaussians, summed over the last dimension."""
    var_ratio = (p.log_std - q.log_std).mul(2).exp()
    mean_term = ((p.mean - q.mean) / q.std).pow(2)
    return 0.5 * (var_ratio + mean_term - 1.0 - 2.0 * (p.log_std - q.log_std)).sum(-1)


def consecutive_plan_kl(current: PlanDistribution, previous: PlanDistribution,
                        same_episode: torch.Tensor) -> torch.Tensor:
    """Mean of KL[p(tau_t) || p(tau_{t-1})] over pairs inside one episode (0 if there are none).

    ``same_episode`` is 1 where step t-1 belongs to step t's episode.
    """
    kl = gaussian_kl(current, previous)
    mask = same_episode.to(kl.dtype)
    return (kl * mask).sum() / mask.sum().clamp(min=1.0)
