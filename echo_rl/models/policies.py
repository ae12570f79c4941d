"""Actor-critic networks and action distributions of the vector policies.

A network is an encoder (:mod:`echo_rl.models.encoders`) with separate actor
and critic heads. A distribution maps the actor's logits to normalised
log-probabilities over the discrete actions; the learners (PPO's clipped loss,
V-trace) work on those, so a swapped distribution changes acting and learning
alike.
"""

from __future__ import annotations

import torch
from torch import nn

from echo_rl.environments.minigrid_vector import MiniGridObsEncoding
from echo_rl.models.encoders import FlatEncoder, MiniGridEncoder, default_encoder, layer_init, make_encoder

NETWORKS = ("minigrid", "mlp")
#: hidden layers of each head, per named encoder (an injected encoder gets DEFAULT_HEAD_HIDDEN)
HEAD_HIDDEN = {"minigrid": (64,), "mlp": (64, 64), "minigrid_cnn": (64,), "nature_cnn": (), "impala_cnn": ()}
DEFAULT_HEAD_HIDDEN = (64,)


def _mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [layer_init(nn.Linear(in_dim, h)), nn.Tanh()]
        in_dim = h
    return nn.Sequential(*layers, layer_init(nn.Linear(in_dim, out_dim), std=out_std))


def make_actor_critic(network: str, obs_dim: int, num_actions: int) -> "ActorCritic":
    """``minigrid``: per-cell embeddings + one hidden layer per head; ``mlp``: SB3's 64x64 MlpPolicy shape."""
    if network == "minigrid":
        return ActorCritic(num_actions, MiniGridEncoder(), hidden=HEAD_HIDDEN["minigrid"])
    if network == "mlp":
        return ActorCritic(num_actions, FlatEncoder(obs_dim), hidden=HEAD_HIDDEN["mlp"])
    raise ValueError(f"unknown policy network {network!r}; allowed: {', '.join(NETWORKS)}")


def build_actor_critic(encoder: str | nn.Module | None, obs_shape: tuple, obs_dtype, num_actions: int,
                       policy_network: str = "minigrid") -> "ActorCritic":
    """Heads around ``encoder``: a name (``None``: :func:`encoders.default_encoder` of the space) or a module
    with ``out_dim``, used as it is (an injected, pretrained encoder keeps its weights)."""
    if isinstance(encoder, nn.Module):
        if not isinstance(getattr(encoder, "out_dim", None), int):
            raise ValueError(f"encoder {type(encoder).__name__} needs an int out_dim attribute (its feature width)")
        return ActorCritic(num_actions, encoder, hidden=DEFAULT_HEAD_HIDDEN)
    name = encoder or default_encoder(obs_shape, obs_dtype, policy_network)
    if name in NETWORKS and len(obs_shape) == 1:  # today's networks, built in today's order (same initial weights)
        obs_dim = int(obs_shape[0])
        symbolic = (MiniGridObsEncoding().size,)
        if name == "minigrid" and tuple(obs_shape) != symbolic:  # checked, not built: the RNG draws stay today's
            raise ValueError(f"encoder 'minigrid' reads MiniGrid's flat symbolic observation of shape {symbolic}, "
                             f"got {tuple(obs_shape)}; for vectors use mlp, for pixels nature_cnn or impala_cnn")
        return make_actor_critic(name, obs_dim, num_actions)
    return ActorCritic(num_actions, make_encoder(name, obs_shape), hidden=HEAD_HIDDEN[name])


class ActorCritic(nn.Module):
    """Separate actor and critic heads over a shared observation encoder."""

    def __init__(self, num_actions: int, encoder: nn.Module, hidden: tuple[int, ...] = (64,)):
        super().__init__()
        self.encoder = encoder
        d = self.encoder.out_dim
        self.actor = _mlp(d, hidden, num_actions, out_std=0.01)
        self.critic = _mlp(d, hidden, 1, out_std=1.0)
        #: logits -> normalised log-probabilities (None: the raw logits, read through a softmax downstream)
        self.distribution: nn.Module | None = None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Action logits and state values."""
        features = self.encoder(obs)
        logits = self.actor(features)
        if self.distribution is not None:
            logits = self.distribution(logits)
        return logits, self.critic(features).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.encoder(obs)).squeeze(-1)


# -- distributions: logits -> normalised log-probabilities ---------------------------------------------------
class Categorical(nn.Module):
    """softmax(logits): the default."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits, -1)


class TemperedCategorical(nn.Module):
    """softmax(logits / temperature): flatter (> 1) or sharper (< 1) action choice for the same logits."""

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r} is invalid: must be > 0")
        self.temperature = float(temperature)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits / self.temperature, -1)


class EpsilonCategorical(nn.Module):
    """(1 - eps) softmax(logits) + eps uniform: every action keeps at least eps / n probability."""

    def __init__(self, epsilon: float = 0.05):
        super().__init__()
        if not 0 <= epsilon < 1:
            raise ValueError(f"epsilon={epsilon!r} is invalid: must be in [0, 1)")
        self.epsilon = float(epsilon)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        n = logits.shape[-1]
        probs = (1 - self.epsilon) * torch.softmax(logits, -1) + self.epsilon / n
        return probs.log()


__all__ = ["ActorCritic", "Categorical", "EpsilonCategorical", "FlatEncoder", "HEAD_HIDDEN", "MiniGridEncoder",
           "NETWORKS", "TemperedCategorical", "build_actor_critic", "layer_init", "make_actor_critic"]
