"""Agent registry: ``--agent NAME`` -> the class that acts and learns, and :func:`build_agent`.

Classes are named as ``"module:attr"`` and imported when built, so this module
stays cheap: ``import echo_rl`` imports it to register the agent-name check
with :mod:`echo_rl.config`.
"""

from __future__ import annotations

import importlib
from typing import Any

from echo_rl.config import ConfigError, TrainingConfig, register_name_rule

# name -> "module:Class"; imported lazily so a config can be validated cheaply.
AGENTS: dict[str, str] = {
    "ppo": "echo_rl.training.ppo_agent:PPOAgent",
    "echo-rl": "echo_rl.training.echo:EchoAgent",
    "impala": "echo_rl.training.impala_agent:IMPALAAgent",
}
TEXT_AGENT = "echo_rl.training.lm.loop:LMAgent"  # text tasks: one language-model agent for ppo (GRPO) and echo-rl
RAY_BUILDER = "echo_rl.distributed.ray_backend:build_ray_agent"  # backend=ray: the vector agent on Ray workers
VECTOR_ENVS = "echo_rl.environments.minigrid_vector:make_vector_env"


def check_agent_name(name: str) -> None:
    if name not in AGENTS:
        raise ConfigError(f"unknown agent {name!r}; allowed: {', '.join(sorted(AGENTS))}")


register_name_rule("agent", check_agent_name)


def _load(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def agent_class(name: str) -> Any:
    check_agent_name(name)
    return _load(AGENTS[name])


def build_agent(config: TrainingConfig, device: Any) -> Any:
    """The :class:`~echo_rl.training.protocol.Agent` that trains ``config``, untrained (or ready to load a
    checkpoint): the language-model agent on text tasks, else ``config.agent`` on ``num_actors`` vector envs
    (on Ray workers with ``backend=ray``). Raises TypeError naming the protocol members an agent lacks."""
    from echo_rl.training.protocol import missing_members  # torch and gymnasium: only when an agent is built

    if config.text_task:
        agent = _load(TEXT_AGENT)(config, device)
    elif config.backend == "ray":
        agent = _load(RAY_BUILDER)(config, device)
    else:
        envs = _load(VECTOR_ENVS)(config.env_name, config.num_actors, asynchronous=config.vector_env == "async",
                                  **config.env_config)
        agent = agent_class(config.agent)(config, envs, device)
    missing = missing_members(agent)
    if missing:
        agent.close()
        raise TypeError(f"agent {type(agent).__name__} does not implement the trainer's Agent protocol: missing "
                        f"{', '.join(missing)} (subclass echo_rl.training.protocol.AgentBase)")
    return agent
