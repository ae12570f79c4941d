"""The built-in LM objectives as losses of :class:`~echo_rl.lm.objectives.ObjectiveInputs`.

Each is a thin, pure adapter from the learner's batch to the loss functions of this package
(:func:`~echo_rl.algorithms.echo_loss.echo_loss_from_logprobs`,
:func:`~echo_rl.algorithms.ppo_rlhf.ppo_rlhf_loss`); the registry
(:mod:`echo_rl.lm.objectives`) names them ``grpo`` and ``ppo-rlhf``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from echo_rl.algorithms.echo_loss import EchoLossTerms, echo_loss_from_logprobs, env_ce_loss
from echo_rl.algorithms.ppo_rlhf import ppo_rlhf_loss
from echo_rl.algorithms.token_logprobs import ce_mask, response_mask


@dataclass
class ObjectiveTerms:
    """What the learner needs back from an objective's loss."""

    loss: torch.Tensor
    metrics: dict[str, float]
    row_env_ce: torch.Tensor | None = None  # [B] detached env CE per trajectory (replay priorities)


def grpo_echo_loss(x: Any) -> EchoLossTerms:
    """GRPO's clipped ratio on the (group-relative or replayed) advantages + λ·env CE."""
    b, cfg = x.batch, x.config
    return echo_loss_from_logprobs(x.logprobs, x.ce_logprobs, b.roles, b.prompt_length, b.behavior_logprobs,
                                   x.advantages, b.env_output_count, lam=x.lam, attention_mask=b.attention_mask,
                                   ce_target=cfg.ce_target, ce_normalization=cfg.ce_normalization,
                                   clip_low=cfg.clip_low, clip_high=cfg.clip_high, ref_logprobs=x.ref_logprobs,
                                   kl_coef=cfg.kl_coef, pg_reduction=cfg.pg_reduction, weights=x.weights)


def ppo_rlhf_echo_loss(x: Any) -> ObjectiveTerms:
    """PPO-RLHF's clipped policy + value loss on the GAE advantages (the KL to the reference is already in the
    rewards) + λ·env CE."""
    b, cfg = x.batch, x.config
    acts = x.actions()
    terms = ppo_rlhf_loss(x.logprobs, b.behavior_logprobs, x.values, x.values.detach(), x.advantages, x.returns,
                          acts, x.value_mask, clip=cfg.clip_low, value_clip=cfg.value_clip or None,
                          vf_coef=cfg.vf_coef, reduction=cfg.pg_reduction, weights=x.weights)
    resp = response_mask(b.prompt_length, b.input_ids.shape[1], b.attention_mask)
    target = ce_mask(b.roles, resp, cfg.ce_target)
    env_ce = env_ce_loss(x.ce_logprobs, target, b.env_output_count, normalization=cfg.ce_normalization,
                         weights=x.weights)
    lam = x.lam
    loss = terms.loss + lam * env_ce if lam else terms.loss
    with torch.no_grad():
        ref, vmask = x.ref_logprobs, x.value_mask
        n = acts.sum().clamp(min=1)
        metrics = {"pg_loss": float(terms.policy_loss), "value_loss": float(terms.value_loss),
                   "env_ce": float(env_ce), "env_ce_scaled": float(lam * env_ce), "lambda": float(lam),
                   "clip_fraction": float(terms.clip_fraction), "tokens_action": float(acts.sum()),
                   "kl": float(((b.behavior_logprobs - ref) * acts).sum() / n) if ref is not None else 0.0,
                   "value_mean": float((x.values * vmask).sum() / vmask.sum().clamp(min=1))}
        row_ce = (-x.ce_logprobs * target).sum(1) / target.sum(1).clamp(min=1)
    return ObjectiveTerms(loss, metrics, row_ce)
