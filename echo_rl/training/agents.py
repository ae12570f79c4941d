"""Agent registry: ``--agent NAME`` -> the class that acts and learns, and :func:`build_agent`.

Built-in classes are named as ``"module:attr"`` and imported when built, so
this module stays cheap: ``import echo_rl`` imports it to register the
agent-name check with :mod:`echo_rl.config`. :func:`register_agent` adds a
vector algorithm from user code (a class, or its ``"module:attr"``): the name
is then valid in ``TrainingConfig.agent``, ``echo-rl train --agent`` and a
benchmark method's ``trainer_agent`` (``echo_rl.evaluation.methods.register_trained``).
"""

from __future__ import annotations

from typing import Any

from echo_rl.config import ConfigError, TrainingConfig, register_name_rule
from echo_rl.utils.optional import load_attr

# name -> "module:Class" (imported lazily so a config can be validated cheaply) or a registered class
AGENTS: dict[str, Any] = {
    "ppo": "echo_rl.vector.ppo_agent:PPOAgent",
    "echo-rl": "echo_rl.vector.echo:EchoAgent",
    "impala": "echo_rl.vector.impala_agent:IMPALAAgent",
    "dqn": "echo_rl.vector.dqn_agent:DQNAgent",
}
TEXT_AGENT = "echo_rl.lm.loop:LMAgent"  # text tasks: one language-model agent for ppo (GRPO) and echo-rl
RAY_BUILDER = "echo_rl.vector.ray_backend:build_ray_agent"  # backend=ray: the vector agent on Ray workers
VECTOR_ENVS = "echo_rl.environments.minigrid_vector:make_vector_env"


REGISTER_HINT = "register your own with echo_rl.training.agents.register_agent(name, AgentClass)"


def register_agent(name: str, agent: Any) -> None:
    """Make ``name`` a vector agent everywhere an agent name is read; registering again replaces it.

    ``agent`` is a class (or its ``"module:Class"``) built as ``agent(config, envs, device)`` that implements
    :class:`~echo_rl.training.protocol.Agent` - an on-policy algorithm subclasses
    :class:`~echo_rl.vector.actor_critic_agent.ActorCriticAgent` and writes ``learn(buf)``. Text tasks
    keep training the language-model agent (``ppo`` / ``echo-rl``).
    """
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ConfigError(f"agent name {name!r} is invalid: must be a non-empty string without surrounding spaces")
    if isinstance(agent, str):
        module, sep, attr = agent.partition(":")
        if not (module and sep and attr):
            raise ConfigError(f"agent {name!r}: {agent!r} is invalid: name the class as 'module:Class'")
    elif not isinstance(agent, type):
        raise ConfigError(f"agent {name!r} is invalid: must be a class or 'module:Class', got {type(agent).__name__}")
    AGENTS[name] = agent


def check_agent_name(name: str) -> None:
    if name not in AGENTS:
        raise ConfigError(f"unknown agent {name!r}; allowed: {', '.join(sorted(AGENTS))} ({REGISTER_HINT})")


register_name_rule("agent", check_agent_name)


def _load(target: Any) -> Any:
    return load_attr(target) if isinstance(target, str) else target


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
    elif config.backend == "ray":  # an agent class may name its own Ray builder (dqn: echo_rl.vector.ray_offpolicy)
        agent = _load(getattr(agent_class(config.agent), "ray_builder", RAY_BUILDER))(config, device)
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
