"""The built-in LM objectives as losses of :class:`~echo_rl.lm.objectives.ObjectiveInputs`.

Each is a thin, pure adapter from the learner's batch to the loss functions of this package
(:func:`~echo_rl.algorithms.echo_loss.echo_loss_from_logprobs`,
:func:`~echo_rl.algorithms.ppo_rlhf.ppo_rlhf_loss`); the registry
(:mod:`echo_rl.lm.objectives`) names them ``grpo``, ``ppo-rlhf`` and ``gigpo`` (GRPO's loss on
:func:`gigpo_step_advantages`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from echo_rl.algorithms.echo_loss import EchoLossTerms, echo_loss_from_logprobs, env_ce_loss
from echo_rl.algorithms.gigpo import gigpo_advantages, token_advantages
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
                                   clip_low=cfg.clip, clip_high=cfg.clip, ref_logprobs=x.ref_logprobs,
                                   kl_coef=cfg.kl_coef, pg_reduction=cfg.pg_reduction, weights=x.weights)


ANCHOR_KEY = "anchor_states"  # TokenTrajectory.info: the anchor state of each step (the rollout worker records it)


def gigpo_step_advantages(trajectories: Sequence[Any], batch: Any, config: Any) -> tuple[torch.Tensor, dict]:
    """GiGPO's per-token advantages ``[B, L]`` for a batch of whole groups (config: ``gigpo_gamma``,
    ``gigpo_omega``, ``gigpo_norm``, ``gigpo_similarity``), and how many steps found an anchor group."""
    states = []
    for t in trajectories:
        s = t.info.get(ANCHOR_KEY)
        if not isinstance(s, (list, tuple)) or len(s) != t.num_turns or not all(isinstance(x, str) for x in s):
            got = f"{len(s)} entries" if isinstance(s, (list, tuple)) else type(s).__name__
            raise ValueError(f"objective='gigpo' needs info[{ANCHOR_KEY!r}] on trajectory {t.episode_id}: one "
                             f"string per action turn ({t.num_turns}); got {got} (the LM rollout worker records "
                             "them)")
        states.append(s)
    adv = gigpo_advantages([t.rewards for t in trajectories], [t.group_id for t in trajectories], states,
                           gamma=config.gigpo_gamma, omega=config.gigpo_omega, scale=config.gigpo_norm,
                           similarity=config.gigpo_similarity)
    tokens = token_advantages(adv.steps, [t.turn_spans() for t in trajectories], tuple(batch.input_ids.shape))
    n = sum(len(s) for s in adv.step_only)
    metrics = {"gigpo_anchored_share": adv.anchored_share, "gigpo_anchor_groups": float(adv.anchor_groups),
               "gigpo_step_adv_abs_mean": float(sum(abs(s).sum() for s in adv.step_only) / max(n, 1)),
               "gigpo_episode_adv_abs_mean": float(adv.episode.abs().mean())}
    return tokens.to(batch.input_ids.device), metrics


def ppo_rlhf_echo_loss(x: Any) -> ObjectiveTerms:
    """PPO-RLHF's clipped policy + value loss on the GAE advantages (the KL to the reference is already in the
    rewards) + λ·env CE."""
    b, cfg = x.batch, x.config
    acts = x.actions()
    terms = ppo_rlhf_loss(x.logprobs, b.behavior_logprobs, x.values, x.values.detach(), x.advantages, x.returns,
                          acts, x.value_mask, clip=cfg.clip, value_clip=cfg.value_clip or None,
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
