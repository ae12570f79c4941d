"""PPO's epochs of clipped-surrogate minibatch updates, once for every agent that learns with them.

Why one function: PPO (``ppo_agent.py``) and the EchoRL agent (``vector/echo/learner.py``)
take the same update on a fresh rollout; only the forward pass differs (EchoRL conditions
the heads on a plan and adds its plan-KL and world-model terms). The caller supplies that
forward pass and its optimiser step; the permutation draws, minibatching, ``ppo_loss``,
early stop on ``target_kl`` and the metric averages are here, so the two learners cannot
drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from echo_rl.algorithms.ppo import ppo_loss
from echo_rl.config import PPOConfig

if TYPE_CHECKING:
    from echo_rl.distributed.data_parallel import DataParallel

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

    def select(self, index: torch.Tensor) -> PPOBatch:
        """The rows at ``index`` (``index_select``: the values of ``t[index]`` at a fraction of its cost)."""
        return PPOBatch(*(t.index_select(0, index) for t in self._fields()))

    def rows(self, start: int, stop: int) -> PPOBatch:
        return PPOBatch(*(t[start:stop] for t in self._fields()))

    def _fields(self) -> tuple[torch.Tensor, ...]:
        return self.actions, self.old_logprobs, self.old_values, self.advantages, self.returns


@dataclass
class Forward:
    """A minibatch's forward pass: logits, values, terms added to PPO's loss (in this order), extra metrics,
    and the continuous distribution whose parameters ``logits`` are (None: a categorical's logits)."""

    logits: torch.Tensor
    values: torch.Tensor
    losses: Sequence[torch.Tensor] = ()
    metrics: Sequence[torch.Tensor] = ()
    distribution: object = None


@dataclass
class PPOEpochs:
    """Per-minibatch means of :data:`BASE_METRICS` and the caller's extra metrics, by name."""

    means: dict[str, float] = field(default_factory=dict)
    minibatches: int = 0
    early_stop: bool = False


def ppo_epochs(ppo: PPOConfig, batch: PPOBatch, np_rng: np.random.Generator,
               forward: Callable[[np.ndarray, torch.Tensor], Forward], step: Callable[[torch.Tensor], object],
               extra_metrics: Sequence[str] = (), dp: DataParallel | None = None) -> PPOEpochs:
    """``ppo.num_epochs`` passes over the batch in ``np_rng``-permuted minibatches of ``ppo.batch_size``.

    ``forward(idx, idx_tensor)`` gets the minibatch's flat indices (numpy, and as a tensor on
    the batch's device); ``step(loss)`` backpropagates, steps and returns the gradient norm.
    Stops early once a minibatch's approximate KL exceeds ``ppo.target_kl``.
    With ``dp`` (one of several data-parallel learners) ``batch`` is this learner's part of the
    global batch: see :func:`_sharded_epochs`.
    """
    if dp is not None:
        return _sharded_epochs(ppo, batch, np_rng, forward, step, extra_metrics, dp)
    n = len(batch)
    mb = min(ppo.batch_size, n)

    def epoch(perm: np.ndarray):
        perm_t = torch.as_tensor(perm, device=batch.actions.device)
        shuffled = batch.select(perm_t)  # one gather per epoch; each minibatch is then a slice of it
        for start in range(0, n, mb):
            out = forward(perm[start:start + mb], perm_t[start:start + mb])
            part = shuffled.rows(start, start + mb)
            terms, loss = _minibatch_loss(ppo, part, out, part.advantages, ppo.normalize_advantages)
            grad_norm = torch.as_tensor(step(loss), dtype=torch.float32).detach().cpu()
            yield _metric_row(terms, grad_norm, out), terms.approx_kl

    return _run_epochs(ppo, n, np_rng, extra_metrics, torch.float32, epoch)


def _run_epochs(ppo: PPOConfig, n: int, np_rng: np.random.Generator, extra_metrics: Sequence[str],
                dtype: torch.dtype, epoch: Callable) -> PPOEpochs:
    """The epoch loop both forms share: a fresh permutation of ``n`` each epoch, ``epoch(perm)`` yields each
    minibatch's metric row and approximate KL once it has stepped; stop once the KL passes ``target_kl``."""
    sums = torch.zeros(len(BASE_METRICS) + len(extra_metrics), dtype=dtype)
    count, stop = 0, False
    for _ in range(ppo.num_epochs):
        for row, approx_kl in epoch(np_rng.permutation(n)):
            sums += row
            count += 1
            if ppo.target_kl is not None and approx_kl.item() > ppo.target_kl:
                stop = True
                break
        if stop:
            break
    names = BASE_METRICS + tuple(extra_metrics)
    return PPOEpochs(dict(zip(names, (sums / count).tolist())), count, stop)


def _minibatch_loss(ppo: PPOConfig, part: PPOBatch, out: Forward, advantages: torch.Tensor, normalize: bool):
    """PPO's loss terms on one minibatch (``part``: its rows) and the loss to step: PPO's plus the forward
    pass's own terms."""
    terms = ppo_loss(out.logits, out.values, part.actions, part.old_logprobs, part.old_values,
                     advantages, part.returns, clip_epsilon=ppo.clip_epsilon,
                     value_loss_coef=ppo.value_loss_coef, entropy_coef=ppo.entropy_coef, kl_coef=ppo.kl_coef,
                     value_clip=ppo.value_clip, normalize_advantages=normalize, distribution=out.distribution)
    loss = terms.loss
    for term in out.losses:
        loss = loss + term
    return terms, loss


def _metric_row(terms, grad_norm: torch.Tensor, out: Forward) -> torch.Tensor:
    """One minibatch's :data:`BASE_METRICS` and the forward pass's extra metrics, in order."""
    return torch.stack([terms.policy_loss.detach().cpu(), terms.value_loss.detach().cpu(),
                        terms.entropy.detach().cpu(), terms.approx_kl.cpu(), terms.clip_fraction.cpu(),
                        grad_norm, *(m.detach().float().cpu() for m in out.metrics)])


def _global_normalise(adv: torch.Tensor, count: int, dp: DataParallel) -> torch.Tensor:
    """``(adv - mean) / (std + 1e-8)`` with the mean and (unbiased) std of the whole minibatch over the learners."""
    total = dp.all_reduce_(adv.sum().detach().double().cpu().reshape(1))
    mean = total / count
    sq = dp.all_reduce_(((adv.double() - mean.to(adv.device)) ** 2).sum().detach().cpu().reshape(1))
    std = (sq / (count - 1)).sqrt()
    return (adv - mean.to(adv.device, adv.dtype)) / (std.to(adv.device, adv.dtype) + 1e-8)


def _sharded_epochs(ppo: PPOConfig, batch: PPOBatch, np_rng: np.random.Generator, forward, step,
                    extra_metrics: Sequence[str], dp: DataParallel) -> PPOEpochs:
    """:func:`ppo_epochs` as one of ``dp.world_size`` learners holding columns of a ``[T, num_actors]`` batch.

    Every learner draws the same permutation of the global batch; on each global minibatch it
    takes the indices it holds (``dp.local_indices``), weights its loss and metrics by its share
    of the minibatch, and ``step`` sums the gradients over the learners, so their sum is the
    one-learner minibatch mean. Advantages are normalised with the minibatch's global statistics;
    the metrics (and so the ``target_kl`` early stop) are summed over the learners too.
    ``step(None)``: this learner holds no sample of the minibatch (zero gradient, still all-reduced).
    """
    n = len(batch) * dp.world_size
    mb = min(ppo.batch_size, n)
    width = len(BASE_METRICS) + len(extra_metrics)

    def epoch(perm: np.ndarray):
        for start in range(0, n, mb):
            global_idx = perm[start:start + mb]
            idx = dp.local_indices(global_idx)
            share = len(idx) / len(global_idx)
            it = torch.as_tensor(idx, device=batch.actions.device)
            part = batch.select(it)
            advantages = part.advantages
            if ppo.normalize_advantages and len(global_idx) > 1:
                advantages = _global_normalise(advantages, len(global_idx), dp)
            if len(idx):
                out = forward(idx, it)
                terms, loss = _minibatch_loss(ppo, part, out, advantages, normalize=False)
                grad_norm = torch.as_tensor(step(loss * share), dtype=torch.float32).detach().cpu()
                local = _metric_row(terms, torch.zeros(()), out).double() * share  # grad norm: set after the sum
            else:
                grad_norm = torch.as_tensor(step(None), dtype=torch.float32).detach().cpu()
                local = torch.zeros(width, dtype=torch.float64)
            mean = dp.all_reduce_(local)
            mean[len(BASE_METRICS) - 1] = float(grad_norm)  # the same on every learner (summed gradients)
            yield mean, mean[3]

    return _run_epochs(ppo, n, np_rng, extra_metrics, torch.float64, epoch)
