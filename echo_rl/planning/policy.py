"""The plan-conditioned actor-critic pi(a | s, tau), V(s, tau): FiLM of the policy trunk by the plan.

``h' = h * (1 + a*g(tau)) + a*b(tau)`` with ``a = soft_prefix_alpha``; ``a = 0`` removes the
plan's influence exactly, which is the "no plan" ablation.
"""

from __future__ import annotations

import torch
from torch import nn

from echo_rl.config import ConfigError
from echo_rl.planning.encoder import _check_positive

__all__ = ["PolicyNetwork"]


class PolicyNetwork(nn.Module):
    """Actor-critic pi(a | s, tau), V(s, tau) with FiLM conditioning on the plan.

    ``trunk(s)`` gives features h; the plan scales and shifts them (FiLM) and
    the policy and value heads read the result. ``alpha``
    (PlanningConfig.soft_prefix_alpha) scales the plan's influence; ``alpha = 0``
    gives exactly the unconditioned network, and so does the zero-initialised
    FiLM layer before it has learned anything. ``heads`` = (policy head, value
    head) lets a caller use its own baseline's heads (the vector agent uses
    PPO's, so the plan is the only difference); otherwise they are linear.
    The width of h is ``trunk.out_dim`` when the trunk has one, else ``hidden_dim``.
    """

    def __init__(self, state_dim: int, action_dim: int, latent_dim: int, hidden_dim: int = 256,
                 alpha: float = 0.5, trunk: nn.Module | None = None,
                 heads: tuple[nn.Module, nn.Module] | None = None):
        super().__init__()
        for name, v in (("state_dim", state_dim), ("action_dim", action_dim), ("latent_dim", latent_dim),
                        ("hidden_dim", hidden_dim)):
            _check_positive(name, v)
        if alpha < 0:
            raise ConfigError(f"alpha={alpha!r} is invalid: must be >= 0")
        self.alpha = float(alpha)
        self.latent_dim = latent_dim
        self.trunk = trunk if trunk is not None else nn.Sequential(
            nn.Linear(state_dim, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, hidden_dim), nn.Tanh())
        width = int(getattr(trunk, "out_dim", hidden_dim)) if trunk is not None else hidden_dim
        self.feature_dim = width
        self.film = nn.Linear(latent_dim, 2 * width)
        nn.init.zeros_(self.film.weight)  # start as the unconditioned policy
        nn.init.zeros_(self.film.bias)
        if heads is not None:
            self.policy_head, self.value_head = heads
        else:
            self.policy_head = nn.Linear(width, action_dim)
            self.value_head = nn.Linear(width, 1)
            nn.init.orthogonal_(self.policy_head.weight, 0.01)
            nn.init.zeros_(self.policy_head.bias)

    def features(self, states: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
        return self.condition(self.trunk(states), plan)

    def condition(self, h: torch.Tensor, plan: torch.Tensor) -> torch.Tensor:
        """FiLM of trunk features ``h`` by the plan sample."""
        if self.alpha == 0.0:
            return h
        scale, shift = self.film(plan).chunk(2, dim=-1)
        return h * (1.0 + self.alpha * torch.tanh(scale)) + self.alpha * shift

    def forward(self, states: torch.Tensor, plan: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (action logits ``[B, action_dim]``, value ``[B]``)."""
        h = self.features(states, plan)
        return self.policy_head(h), self.value_head(h).squeeze(-1)
