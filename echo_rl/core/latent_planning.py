"""Latent planning: a plan tau_t = F_phi(s_{t-k+1:t}) conditions the policy pi(a | s, tau).

The encoder reads a window of the last k states and returns a diagonal Gaussian
p_phi(tau_t | s_1:t). The policy conditions on a reparameterised sample
tau = mu + sigma * eps, with eps drawn by the actor and stored, so the learner
recomputes exactly the plan the actor used (importance ratios stay exact) while
gradients still reach the encoder. A KL term keeps consecutive plans close:
``L_KL = KL[p(tau_t | s_1:t) || p(tau_{t-1} | s_1:t-1)]``, counted only where t
and t-1 lie in the same episode.

Episode boundaries: a window carries a validity mask; states of an earlier
episode are zeroed *before* any computation, so they cannot leak into a plan.

Conditioning (FiLM, a "soft prefix" for an MLP): the plan produces a per-unit
scale and shift of the policy trunk, ``h' = h * (1 + a*g(tau)) + a*b(tau)``
with ``a = soft_prefix_alpha``. ``a = 0`` removes the plan's influence exactly,
which is the "no plan" ablation; for a language model the same plan becomes
soft-prefix embeddings scaled by ``a``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
from torch import nn

from echo_rl.config import ConfigError, PlanningConfig
from echo_rl.kernels.planning import EMAPlanTracker, plan_surprise_batch

__all__ = [
    "PlanningConfig", "PlanDistribution", "TrajectoryEncoder", "PolicyNetwork", "LatentPlanningOptimizer",
    "StateWindow", "gaussian_kl", "consecutive_plan_kl",
]

LOG_STD_MIN, LOG_STD_MAX = -5.0, 1.0


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
        self.optimizer = torch.optim.Adam(groups, eps=1e-5)
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
