"""Action distributions for continuous (Box) action spaces, and the choice of distribution by action space.

A discrete distribution (``echo_rl.models.policies.Categorical`` and kin) maps the
actor's logits to log-probabilities, which every learner reads through a softmax.
A continuous distribution cannot be read that way, so it carries its own maths:
``continuous = True`` and

- ``forward(head) -> params``: the actor head's output to the tensor the network returns
  in place of logits (acting, rollouts, Ray workers and checkpoints pass it through as it is);
- ``sample(params, generator)``, ``log_prob(params, actions)``, ``entropy(params)``, ``mode(params)``.

:class:`DiagGaussian` is CleanRL's ``ppo_continuous_action.py`` policy: the head gives the
mean, a state-independent learned log-std gives the spread, actions are drawn unbounded and
the log-probability is that of the unbounded draw. Clipping to the Box bounds happens only
in the env (``echo_rl.environments.gym_vector.ClipToBounds``), so PPO's ratio is between two
densities of the same action.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from echo_rl.config import ConfigError

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def is_continuous(distribution) -> bool:
    """Whether ``distribution`` is a continuous one (the protocol in the module docstring)."""
    return bool(getattr(distribution, "continuous", False))


def is_box(space) -> bool:
    """A continuous (Box) action space: 1-D float actions with bounds (Discrete spaces have ``n``)."""
    return not hasattr(space, "n") and getattr(space, "dtype", None) is not None and \
        np.issubdtype(space.dtype, np.floating) and len(getattr(space, "shape", ()) or ()) == 1


def refuse_continuous(envs, task: str, agent: str) -> None:
    """ConfigError (one line, naming the agent that can) if ``envs`` act in a continuous action space."""
    space = envs.single_action_space
    if hasattr(space, "n"):
        return
    envs.close()
    kind = "continuous (Box)" if is_box(space) else type(space).__name__
    raise ConfigError(f"task {task!r} has {kind} actions; --agent {agent} acts in discrete action spaces only; "
                      f"use --agent ppo for continuous actions")


class DiagGaussian(nn.Module):
    """N(mean, diag(exp(log_std)^2)): the mean from the actor head, one learned log-std per action dimension.

    ``params`` is ``[..., 2 * action_dim]``: the mean, then the log-std broadcast to the batch, so a
    stored forward pass holds everything ``log_prob`` and ``entropy`` need.
    """

    continuous = True

    def __init__(self, action_dim: int, init_log_std: float = 0.0):
        super().__init__()
        if not isinstance(action_dim, int) or action_dim < 1:
            raise ValueError(f"action_dim={action_dim!r} is invalid: must be an int >= 1")
        self.action_dim = action_dim
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, mean: torch.Tensor) -> torch.Tensor:
        if mean.shape[-1] != self.action_dim:
            raise ValueError(f"the actor head gives {mean.shape[-1]} outputs; this distribution has "
                             f"action_dim={self.action_dim}")
        return torch.cat([mean, self.log_std.expand_as(mean)], -1)

    def split(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, log_std) of ``params``."""
        return params[..., :self.action_dim], params[..., self.action_dim:]

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Sum over action dimensions of the Normal log-density of the (unclipped) ``actions``."""
        mean, log_std = self.split(params)
        z = (actions.to(mean.dtype) - mean) * torch.exp(-log_std)
        return (-0.5 * z * z - log_std - _HALF_LOG_2PI).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        _, log_std = self.split(params)
        return (0.5 + _HALF_LOG_2PI + log_std).sum(-1)

    def sample(self, params: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """mean + std * eps, eps ~ N(0, I) drawn from ``generator`` (on its device, then moved)."""
        mean, log_std = self.split(params)
        device = generator.device if generator is not None else mean.device
        eps = torch.randn(mean.shape, generator=generator, device=device, dtype=mean.dtype).to(mean.device)
        return mean + torch.exp(log_std) * eps

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return self.split(params)[0]

    def extra_repr(self) -> str:
        return f"action_dim={self.action_dim}"


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One action index per row of ``probs`` (``[..., n]``), shape ``[..., 1]``: ``torch.multinomial(probs, 1)``'s draw.

    Why not ``torch.multinomial``: for one sample it computes ``argmax(probs / q)``, ``q ~ Exp(1)`` drawn
    from ``generator`` (the exponential race), after three validity checks that each sync and cost more
    than the draw; acting calls it every env step. This is that computation without the checks: the same
    ``exponential_`` draws, so the same actions (``tests/test_models/test_distributions.py`` compares the
    two). Off the CPU it calls ``torch.multinomial``. Rows with NaNs are not refused here; the caller checks.
    """
    if probs.device.type != "cpu":
        return torch.multinomial(probs, 1, generator=generator)
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return torch.div(probs, q, out=q).argmax(-1, keepdim=True)


def default_distribution(action_space) -> nn.Module | None:
    """The distribution an action space gets unless the user sets one: Box -> :class:`DiagGaussian`,
    Discrete -> None (the network's raw logits, read as a categorical, as before distributions existed)."""
    if hasattr(action_space, "n"):
        return None
    if is_box(action_space):
        return DiagGaussian(int(action_space.shape[0]))
    raise ConfigError(f"{type(action_space).__name__} action spaces are not supported: the vector agents act in "
                      f"Discrete or 1-D Box action spaces")


def check_fits(distribution, action_space) -> None:
    """ValueError (one line) when a distribution does not fit the action space it would act in."""
    continuous = not hasattr(action_space, "n")
    if continuous != is_continuous(distribution):
        want = "a continuous one (continuous = True, e.g. DiagGaussian)" if continuous else "a categorical one"
        raise ValueError(f"{type(distribution).__name__} does not fit a {type(action_space).__name__} action space; "
                         f"it needs {want}")
    dim = getattr(distribution, "action_dim", None)
    if continuous and dim is not None and dim != action_space.shape[0]:
        raise ValueError(f"{type(distribution).__name__} has action_dim={dim}; the action space has "
                         f"{action_space.shape[0]} dimensions")


__all__ = ["DiagGaussian", "check_fits", "default_distribution", "is_box", "is_continuous", "refuse_continuous",
           "sample_categorical"]
