"""The PPO loss (Schulman et al. 2017) as a pure function with named terms."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PPOLossTerms:
    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


def ppo_loss(logits: torch.Tensor, values: torch.Tensor, actions: torch.Tensor, old_logprobs: torch.Tensor,
             old_values: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor, *,
             clip_epsilon: float, value_loss_coef: float, entropy_coef: float, kl_coef: float = 0.0,
             value_clip: float | None = None, normalize_advantages: bool = True,
             distribution=None) -> PPOLossTerms:
    """Clipped surrogate + (optionally clipped) value loss - entropy bonus + kl_coef * KL(old||new).

    ``approx_kl`` is the low-variance estimator E[(r - 1) - log r] (Schulman's k3). ``logits`` are a
    categorical's, unless ``distribution`` is a continuous one (``echo_rl.models.distributions``):
    then they are its parameters and it gives the log-probabilities and the entropy.
    """
    if getattr(distribution, "continuous", False):
        logprobs = distribution.log_prob(logits, actions)
        entropy = distribution.entropy(logits).mean()
    else:
        logp_all = torch.log_softmax(logits, dim=-1)
        logprobs = logp_all.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    if normalize_advantages and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    surrogate = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_epsilon, 1 + clip_epsilon))
    policy_loss = surrogate.mean()
    if value_clip is not None:
        clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
        value_loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()
    else:
        value_loss = 0.5 * ((values - returns) ** 2).mean()
    approx_kl = ((ratio - 1) - log_ratio).mean()
    loss = policy_loss + value_loss_coef * value_loss - entropy_coef * entropy + kl_coef * approx_kl
    with torch.no_grad():
        clip_fraction = ((ratio - 1).abs() > clip_epsilon).float().mean()
    return PPOLossTerms(loss, policy_loss, value_loss, entropy, approx_kl.detach(), clip_fraction)
