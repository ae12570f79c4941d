"""``LatentPlanningOptimizer``: encoder + plan-conditioned actor-critic + their optimiser, the plan KL and
the EMA plan that plan surprise is measured against."""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
from torch import nn

from echo_rl.config import ConfigError, PlanningConfig
from echo_rl.kernels.planning import EMAPlanTracker, plan_surprise_batch
from echo_rl.planning.distribution import PlanDistribution, consecutive_plan_kl
from echo_rl.planning.encoder import TrajectoryEncoder
from echo_rl.planning.policy import PolicyNetwork

__all__ = ["LatentPlanningOptimizer"]


class LatentPlanningOptimizer:
    """Encoder + plan-conditioned actor-critic + their optimiser, with the plan KL regulariser.

    The encoder has its own parameter group (``PlanningConfig.learning_rate``)
    and its own gradient clip (``PlanningConfig.max_grad_norm``); the policy's
    learning rate and clip come from the caller (its RL algorithm).
    ``extra_modules`` (auxiliary heads, e.g. a world model) get a third group
    with the policy's learning rate and their own clip of the same size, so an
    auxiliary loss never shrinks the policy's clipped step.
    ``ema_decay`` drives the EMA plan tau_bar whose distance to a new plan is
    the plan surprise the prioritized replay samples by.
    """

    def __init__(self, state_dim: int, action_dim: int, config: PlanningConfig | None = None, *,
                 policy_lr: float = 3e-4, policy_max_grad_norm: float = 0.5, hidden_dim: int = 256,
                 trunk: nn.Module | None = None, heads: tuple[nn.Module, nn.Module] | None = None,
                 extra_modules: Iterable[nn.Module] = ()):
        if config is not None and not isinstance(config, PlanningConfig):
            raise ConfigError(f"config must be a PlanningConfig, got {type(config).__name__}")
        self.config = config or PlanningConfig()
        self.encoder = TrajectoryEncoder(state_dim, self.config)
        self.policy = PolicyNetwork(state_dim, action_dim, self.config.embedding_dim, hidden_dim,
                                    alpha=self.config.soft_prefix_alpha, trunk=trunk, heads=heads)
        self.extra = nn.ModuleList(list(extra_modules))
        self.policy_max_grad_norm = policy_max_grad_norm
        groups = [{"params": list(self.policy.parameters()), "lr": policy_lr, "name": "policy",
                   "max_grad_norm": policy_max_grad_norm},
                  {"params": list(self.encoder.parameters()), "lr": self.config.learning_rate, "name": "encoder",
                   "max_grad_norm": self.config.max_grad_norm}]
        if list(self.extra.parameters()):
            groups.append({"params": list(self.extra.parameters()), "lr": policy_lr, "name": "aux",
                           "max_grad_norm": policy_max_grad_norm})
        for g in groups:
            g["base_lr"] = g["lr"]
        # foreach: one call per step for all parameters (torch picks it only on GPUs); the same arithmetic on
        # the same kernels, so the same weights (the agents' digests are unchanged)
        self.optimizer = torch.optim.Adam(groups, eps=1e-5, foreach=True)
        self.ema_plan = EMAPlanTracker(self.config.ema_decay, self.config.embedding_dim)

    # -- acting / learning ------------------------------------------------
    def modules(self) -> nn.ModuleDict:
        return nn.ModuleDict({"encoder": self.encoder, "policy": self.policy, "extra": self.extra})

    def plan(self, windows: torch.Tensor, masks: torch.Tensor) -> PlanDistribution:
        return self.encoder(windows, masks)

    def forward(self, states: torch.Tensor, windows: torch.Tensor, masks: torch.Tensor,
                eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, PlanDistribution, torch.Tensor]:
        """-> (logits, value, plan distribution, plan sample used)."""
        dist = self.encoder(windows, masks)
        tau = dist.rsample(eps)
        logits, value = self.policy(states, tau)
        return logits, value, dist, tau

    def kl_loss(self, windows: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        """Plan KL from windows of k+1 states: slots 1..k give tau_t, slots 0..k-1 give tau_{t-1}.

        ``masks[:, -2]`` says whether s_{t-1} is in s_t's episode; pairs that
        cross an episode start contribute nothing.
        """
        current, previous = self.encoder.consecutive(windows, masks)
        return consecutive_plan_kl(current, previous, masks[:, -2])

    def set_learning_rate_scale(self, frac: float) -> None:
        """Every group's learning rate = ``frac`` x its configured rate (linear annealing)."""
        for g in self.optimizer.param_groups:
            g["lr"] = frac * g["base_lr"]

    def step(self, loss: torch.Tensor) -> dict[str, float]:
        """One optimiser step; each parameter group (policy, encoder, aux) is clipped on its own."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norms = {}
        for g in self.optimizer.param_groups:
            norms[f"grad_norm_{g['name']}"] = float(nn.utils.clip_grad_norm_(g["params"], g["max_grad_norm"]))
        self.optimizer.step()
        return norms

    # -- plan surprise ----------------------------------------------------
    def plan_surprise(self, plans: np.ndarray, update: bool = True) -> np.ndarray:
        """||tau - tau_bar||^2 per plan against the EMA plan, which then folds in the batch mean."""
        plans = np.asarray(plans, dtype=np.float64).reshape(-1, self.config.embedding_dim)
        mean = plans.mean(0)
        ema = self.ema_plan.mean if self.ema_plan.initialized else mean
        surprise = plan_surprise_batch(plans, ema)
        if update:
            self.ema_plan.update(mean)
        return surprise

    def state_dict(self) -> dict:
        return {"modules": self.modules().state_dict(), "optimizer": self.optimizer.state_dict(),
                "ema_plan": _plain(self.ema_plan.state_dict())}

    def load_state_dict(self, state: dict) -> None:
        self.modules().load_state_dict(state["modules"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.ema_plan.load_state_dict(state["ema_plan"])


def _plain(state: dict) -> dict:
    """numpy arrays -> lists, so checkpoints load with ``torch.load(weights_only=True)``."""
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in state.items()}
