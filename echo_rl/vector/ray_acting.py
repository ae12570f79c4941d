"""What a Ray rollout worker acts with: the acting half of the configured agent, over the worker's env slice.

Each agent kind acts with its own code, unchanged: an :class:`ActorCriticAgent` (PPO,
IMPALA) with its network, sampler and collector; the EchoRL agent's
:class:`~echo_rl.vector.echo.actor.EchoActor` (plan windows, plan noise) on the shared
collector. Both expose the same few members to :class:`~echo_rl.vector.ray_backend.RolloutWorker`:
``network`` (loaded with the learner's weights), ``collector``, ``collect()``,
``reset(seed)``, ``state()`` / ``load_state()``, ``close()``.
"""

from __future__ import annotations

import torch

from echo_rl.config import TrainingConfig
from echo_rl.environments.minigrid_vector import actor_seeds
from echo_rl.vector.actor_critic_agent import ActorCriticAgent
from echo_rl.vector.echo.actor import EchoActor, rollout_fields
from echo_rl.vector.echo.agent import EchoAgent
from echo_rl.vector.echo.model import EchoModel
from echo_rl.vector.rollout import RolloutBuffer, VectorRolloutCollector, torch_generator


class _ContinuousActorCritic(ActorCriticAgent):
    """The acting half of an agent that acts in Box action spaces too (PPO: a DiagGaussian)."""

    continuous_actions = True


class ActorCriticActing:
    """An ActorCriticAgent over the slice, used only to act (the sampler and collector every baseline acts with)."""

    def __init__(self, config: TrainingConfig, envs, continuous_actions: bool = False):
        acting_class = _ContinuousActorCritic if continuous_actions else ActorCriticAgent
        self.agent = acting_class(config, envs, torch.device("cpu"))

    @property
    def network(self) -> torch.nn.Module:
        return self.agent.network

    @property
    def collector(self) -> VectorRolloutCollector:
        return self.agent.collector

    def reset(self, seed: int) -> None:
        """Envs seeded from ``seed`` (one seed per env, as the in-process backend gives them), sampler ``seed+1``."""
        envs = self.agent.collector.envs
        self.agent.collector = VectorRolloutCollector(envs, self.agent.num_steps, actor_seeds(seed, envs.num_envs))
        self.agent.generator = torch_generator(seed + 1)

    def collect(self) -> RolloutBuffer:
        return self.agent.collector.collect(self.agent._policy, self.agent._value)

    def state(self) -> dict:
        return {"collector": self.agent.collector, "generator": self.agent.generator.get_state()}

    def load_state(self, state: dict) -> None:
        self.agent.collector.envs.close()
        self.agent.collector = state["collector"]
        self.agent.generator.set_state(state["generator"])

    def close(self) -> None:
        self.agent.close()


class EchoActing:
    """The EchoRL actor over the slice: its plan encoder and heads, its windows, the collector's extra fields."""

    def __init__(self, config: TrainingConfig, envs):
        self.config, self.envs = config, envs
        self.num_steps = config.batch_size // envs.num_envs
        self.model = EchoModel(config, int(envs.single_observation_space.shape[0]), int(envs.single_action_space.n),
                               torch.device("cpu"))
        self.actor = EchoActor(self.model, envs.num_envs, torch_generator(config.seed + 1))
        self.collector = self._collector(config.seed)

    def _collector(self, seed: int) -> VectorRolloutCollector:
        return VectorRolloutCollector(self.envs, self.num_steps, actor_seeds(seed, self.envs.num_envs),
                                      extras=rollout_fields(self.model), next_observations=True)

    @property
    def network(self) -> torch.nn.Module:
        return self.model.acting

    def reset(self, seed: int) -> None:
        """Envs seeded from ``seed``, sampler ``seed+1`` (the in-process agent's), empty plan windows."""
        self.collector = self._collector(seed)
        self.actor.generator = torch_generator(seed + 1)
        self.actor.reset_windows()

    def collect(self) -> RolloutBuffer:
        return self.collector.run(self.actor)

    def state(self) -> dict:
        windows = {name: getattr(self.actor, name) for name in EchoActor.STATE}
        return {"collector": self.collector, "generator": self.actor.generator.get_state(), "windows": windows}

    def load_state(self, state: dict) -> None:
        self.collector.envs.close()
        self.collector = state["collector"]
        self.envs = self.collector.envs
        self.actor.generator.set_state(state["generator"])
        for name, value in state["windows"].items():
            setattr(self.actor, name, value)

    def close(self) -> None:
        self.collector.envs.close()


def acting_part(agent_class: type, config: TrainingConfig, envs):
    """The acting half of ``agent_class`` over ``envs`` (a worker's slice, ``config`` that slice's config)."""
    if issubclass(agent_class, EchoAgent):
        return EchoActing(config, envs)
    return ActorCriticActing(config, envs, continuous_actions=agent_class.continuous_actions)


#: agent classes that run on Ray (their acting half is above)
RAY_AGENT_BASES = (ActorCriticAgent, EchoAgent)
