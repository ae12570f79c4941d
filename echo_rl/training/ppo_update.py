"""PPO's epochs of clipped-surrogate minibatch updates, once for every agent that learns with them.

Why one function: PPO (``ppo_agent.py``) and the EchoRL agent (``training/echo/learner.py``)
take the same update on a fresh rollout; only the forward pass differs (EchoRL conditions
the heads on a plan and adds its plan-KL and world-model terms). The caller supplies that
forward pass and its optimiser step; the permutation draws, minibatching, ``ppo_loss``,
early stop on ``target_kl`` and the metric averages are here, so the two learners cannot
drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from echo_rl.algorithms.ppo import ppo_loss
from echo_rl.config import PPOConfig

#: the metrics every PPO update reports, in the order of :attr:`PPOEpochs.means`
BASE_METRICS = ("loss/policy", "loss/value", "loss/entropy", "loss/approx_kl", "loss/clip_fraction", "loss/grad_norm")


@dataclass
class PPOBatch:
    """The flat ``[T*N]`` rollout tensors PPO's loss reads besides the forward pass."""

    actions: torch.Tensor
    old_logprobs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor

    def __len__(self) -> int:
        return self.actions.shape[0]


@dataclass
class Forward:
    """A minibatch's forward pass: logits, values, terms added to PPO's loss (in this order), extra metrics."""

    logits: torch.Tensor
    values: torch.Tensor
    losses: Sequence[torch.Tensor] = ()
    metrics: Sequence[torch.Tensor] = ()


@dataclass
class PPOEpochs:
    """Per-minibatch means of :data:`BASE_METRICS` and the caller's extra metrics, by name."""

    means: dict[str, float] = field(default_factory=dict)
    minibatches: int = 0
    early_stop: bool = False


def ppo_epochs(ppo: PPOConfig, batch: PPOBatch, np_rng: np.random.Generator,
               forward: Callable[[np.ndarray, torch.Tensor], Forward], step: Callable[[torch.Tensor], object],
               extra_metrics: Sequence[str] = ()) -> PPOEpochs:
    """``ppo.num_epochs`` passes over the batch in ``np_rng``-permuted minibatches of ``ppo.batch_size``.

    ``forward(idx, idx_tensor)`` gets the minibatch's flat indices (numpy, and as a tensor on
    the batch's device); ``step(loss)`` backpropagates, steps and returns the gradient norm.
    Stops early once a minibatch's approximate KL exceeds ``ppo.target_kl``.
    """
    n = len(batch)
    mb = min(ppo.batch_size, n)
    sums = torch.zeros(len(BASE_METRICS) + len(extra_metrics))
    count, stop = 0, False
    for _ in range(ppo.num_epochs):
        perm = np_rng.permutation(n)
        for start in range(0, n, mb):
            idx = perm[start:start + mb]
            it = torch.as_tensor(idx, device=batch.actions.device)
            out = forward(idx, it)
            terms = ppo_loss(out.logits, out.values, batch.actions[it], batch.old_logprobs[it],
                             batch.old_values[it], batch.advantages[it], batch.returns[it],
                             clip_epsilon=ppo.clip_epsilon, value_loss_coef=ppo.value_loss_coef,
                             entropy_coef=ppo.entropy_coef, kl_coef=ppo.kl_coef, value_clip=ppo.value_clip,
                             normalize_advantages=ppo.normalize_advantages)
            loss = terms.loss
            for term in out.losses:
                loss = loss + term
            grad_norm = torch.as_tensor(step(loss), dtype=torch.float32).detach().cpu()
            sums += torch.stack([terms.policy_loss.detach().cpu(), terms.value_loss.detach().cpu(),
                                 terms.entropy.detach().cpu(), terms.approx_kl.cpu(), terms.clip_fraction.cpu(),
                                 grad_norm, *(m.detach().float().cpu() for m in out.metrics)])
            count += 1
            if ppo.target_kl is not None and terms.approx_kl.item() > ppo.target_kl:
                stop = True
                break
        if stop:
            break
    names = BASE_METRICS + tuple(extra_metrics)
    return PPOEpochs(dict(zip(names, (sums / count).tolist())), count, stop)
