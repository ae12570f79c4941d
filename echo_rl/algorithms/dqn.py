"""DQN's pure pieces: the TD target, the importance-weighted TD loss, the epsilon and beta schedules.

The target of a transition (s, a, r, s', terminated) is

    y = r + gamma * (1 - terminated) * Q_target(s', a*),
    a* = argmax_a Q_target(s', a)            (DQN, Mnih et al. 2015)
    a* = argmax_a Q_online(s', a)            (Double DQN, van Hasselt et al. 2016)

Only termination cuts the bootstrap: a time-limit truncation stores s' = final_obs and
terminated = 0, so it bootstraps like any other step. The loss is the mean over the batch of
``w_i * l(Q(s_i, a_i) - y_i)``, ``l`` Huber (smooth L1, delta 1) or squared error (1/2 delta^2, so
both have gradient delta near 0), and ``w_i`` the prioritized-replay importance weights
(Schaul et al. 2016; all 1 for uniform replay). The TD errors ``delta_i = y_i - Q(s_i, a_i)``
come back detached: ``|delta|`` is the new priority of each sampled transition.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

LOSSES = ("huber", "mse")


class DQNLoss(NamedTuple):
    loss: torch.Tensor       # scalar, differentiable in the online Q values
    td_errors: torch.Tensor  # y - Q(s, a), detached  [B]


@torch.no_grad()
def td_targets(rewards: torch.Tensor, terminated: torch.Tensor, next_q_target: torch.Tensor, gamma: float,
               next_q_online: torch.Tensor | None = None) -> torch.Tensor:
    """``r + gamma (1 - terminated) Q_target(s', a*)`` per transition; ``next_q_*`` are ``[B, A]``.

    ``next_q_online`` given: Double DQN (the online network picks a*, the target network values it)."""
    if next_q_target.dim() != 2 or next_q_target.shape[0] != rewards.shape[0]:
        raise ValueError(f"next_q_target must be [B, A] with B={rewards.shape[0]}, got {list(next_q_target.shape)}")
    if next_q_online is None:
        best = next_q_target.max(-1).values
    else:
        if next_q_online.shape != next_q_target.shape:
            raise ValueError(f"next_q_online {list(next_q_online.shape)} and next_q_target "
                             f"{list(next_q_target.shape)} differ in shape")
        best = next_q_target.gather(-1, next_q_online.argmax(-1, keepdim=True)).squeeze(-1)
    return rewards + gamma * (1.0 - terminated.float()) * best


def dqn_loss(q_values: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor,
             weights: torch.Tensor | None = None, kind: str = "huber") -> DQNLoss:
    """Importance-weighted TD loss of the online ``q_values`` ``[B, A]`` at ``actions`` against ``targets``."""
    if kind not in LOSSES:
        raise ValueError(f"kind={kind!r} is invalid: allowed: {', '.join(LOSSES)}")
    q_taken = q_values.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    targets = targets.detach()
    if kind == "huber":
        per = F.smooth_l1_loss(q_taken, targets, reduction="none", beta=1.0)
    else:
        per = 0.5 * (q_taken - targets).pow(2)
    if weights is not None:
        per = per * weights.to(per.dtype)
    return DQNLoss(per.mean(), (targets - q_taken).detach())


def linear_epsilon(start: float, end: float, duration: float, step: float) -> float:
    """CleanRL's ``linear_schedule``: ``start`` at step 0, linearly to ``end`` at ``duration``, then ``end``."""
    if duration <= 0:
        return end
    return max(end, start + (end - start) * step / duration) if end <= start else \
        min(end, start + (end - start) * step / duration)


def annealed_beta(start: float, horizon: float, step: float) -> float:
    """PER's importance exponent (Schaul et al. 2016): ``start`` at step 0, linearly to 1 at ``horizon``, then 1."""
    if horizon <= 0:
        return 1.0
    return min(1.0, start + (1.0 - start) * step / horizon)


__all__ = ["DQNLoss", "LOSSES", "annealed_beta", "dqn_loss", "linear_epsilon", "td_targets"]
