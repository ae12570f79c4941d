"""The exported function of a vector policy: observation(s) -> (action logits, state value).

PPO and IMPALA act from one observation. The EchoRL agent's ``act()`` also
reads a latent plan: the plan mean of a window of the last k states of the
episode (``window`` uint8 ``[B, k, obs_dim]``, oldest first, and ``mask`` bool
``[B, k]``, True on slots of the current episode). Its logits depend on the
plan *mean* only (the sampled plan feeds the world model, never the policy), so
the graph reproduces ``act()``'s action distribution exactly; with
``latent_plan=false`` it takes the observation alone, as PPO does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.registry import minigrid_id

FORMAT_VERSION = 1


class ActorCriticGraph(nn.Module):
    """PPO / IMPALA: ``ActorCritic`` as is."""

    def __init__(self, network: nn.Module):
        super().__init__()
        self.network = network

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.network(obs)


class EchoPlanGraph(nn.Module):
    """The EchoRL agent: trunk + FiLM on the plan mean of the state window, then the heads."""

    def __init__(self, agent: Any):
        super().__init__()
        self.modules_ = agent.lpo.modules()  # registered, so eval()/state follow
        # the agent's own plan and heads functions (EchoModel's, or the agent's in the one-module layout)
        model = getattr(agent, "model", None)
        self._plan, self._heads = (model.plan, model.heads) if hasattr(model, "heads") else (agent._plan, agent._heads)

    def forward(self, obs: torch.Tensor, window: torch.Tensor, mask: torch.Tensor):
        logits, values, _ = self._heads(obs, self._plan(window, mask), None)
        return logits, values


class EchoNoPlanGraph(EchoPlanGraph):
    """The EchoRL agent with ``latent_plan=false``: no window, the trunk and heads alone."""

    def forward(self, obs: torch.Tensor):  # type: ignore[override]
        logits, values, _ = self._heads(obs, None, None)
        return logits, values


def policy_graph(agent: Any, config: TrainingConfig) -> tuple[nn.Module, dict]:
    """(module in eval mode, metadata) for a vector agent with its weights loaded."""
    from echo_rl.environments.minigrid_vector import make_vector_env  # gymnasium, minigrid: loaded on first use

    if getattr(getattr(getattr(agent, "network", None), "distribution", None), "continuous", False):
        raise ConfigError(f"the {config.agent} policy of task {config.env_name!r} acts in a continuous (Box) action "
                          f"space; exported policies act by logits (discrete actions) only")

    envs = make_vector_env(config.env_name, 1, **config.env_config)  # the observation the policy was trained on
    space = envs.single_observation_space
    envs.close()
    obs_shape, obs_dtype = [int(d) for d in space.shape], np.dtype(space.dtype).name
    obs_dim = int(np.prod(obs_shape))
    if config.agent == "echo-rl":
        plan = bool(agent.echo.latent_plan)
        graph: nn.Module = EchoPlanGraph(agent) if plan else EchoNoPlanGraph(agent)
        window = int(config.planning_config.state_window_size) if plan else 0
    else:
        graph, window = ActorCriticGraph(agent.network), 0
    graph.eval()
    with torch.no_grad():
        probe = {"obs_dim": obs_dim, "obs_shape": obs_shape, "obs_dtype": obs_dtype, "window": window}
        num_actions = int(graph(*example_inputs(probe))[0].shape[-1])
    meta = {"echo_rl_export": FORMAT_VERSION, "agent": config.agent, "env_name": config.env_name,
            "policy_network": config.policy_network, "seed": config.seed, "obs_dim": obs_dim, "obs_shape": obs_shape,
            "obs_dtype": obs_dtype,
            "num_actions": num_actions, "window": window,
            "inputs": ["obs", "window", "mask"] if window else ["obs"], "outputs": ["logits", "value"],
            "obs_encoding": obs_encoding(config)}
    return graph, meta


def obs_encoding(config: TrainingConfig) -> dict | None:
    """How a raw MiniGrid observation becomes the flat uint8 input, so a user outside echo_rl can build it
    (examples/standalone_policy.py): image (7x7x3 indices) flattened, direction, then a bag of mission words.
    None for other envs (their observation is the input as is)."""
    # gymnasium, minigrid: loaded on first use
    from echo_rl.environments.minigrid_vector import MISSION_VOCAB, MiniGridObsEncoding

    if minigrid_id(config.env_name) is None:
        return None
    e = MiniGridObsEncoding()
    return {"env_id": minigrid_id(config.env_name), "env_config": dict(config.env_config),
            "layout": ["image", "direction", "mission_words"], "image_size": e.image_size,
            "mission_vocab": list(MISSION_VOCAB), "mission_other_slot": e.mission_words - 1}


def example_inputs(meta: dict, batch: int = 2) -> tuple[torch.Tensor, ...]:
    dtype = getattr(torch, meta.get("obs_dtype", "uint8"))
    obs = torch.zeros(batch, *meta.get("obs_shape", [meta["obs_dim"]]), dtype=dtype)
    if not meta["window"]:
        return (obs,)
    window = torch.zeros(batch, meta["window"], meta["obs_dim"], dtype=dtype)
    mask = torch.zeros(batch, meta["window"], dtype=torch.bool)
    mask[:, -1] = True
    return obs, window, mask
