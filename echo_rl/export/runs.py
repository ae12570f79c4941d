"""Open a trained run directory as an agent with its newest weights, for export and ``load_policy``.

Weights only (``rollout=False``): the envs mid-episode are never unpickled or
rebuilt, and the agent is built on one actor (a policy acts on any batch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.training.agents import build_agent
from echo_rl.training.run_dir import RunDirectory

VECTOR_AGENTS = ("ppo", "impala", "echo-rl")


def run_config(run_dir: str | Path, flag: str = "--run-dir") -> TrainingConfig:
    return RunDirectory.config_of(run_dir, flag=flag)


def newest_payload(run_dir: str | Path, config: TrainingConfig, flag: str = "--run-dir") -> tuple[dict, str]:
    """(state.pt payload, checkpoint name) of the newest checkpoint that loads; ConfigError when the run
    has none (not trained yet) or none loads."""
    run = RunDirectory(run_dir, config)
    if run.latest_checkpoint() is None:
        raise ConfigError(f"{flag} {run_dir} has no checkpoint: the run is not trained yet "
                          f"(train it with `echo-rl train --run-dir {run_dir}`)")
    got: dict[str, Any] = {}
    ckpt = run.load_newest(lambda payload, _: got.setdefault("payload", payload), rollout=False)
    return got["payload"], ckpt.name


def load_vector_agent(run_dir: str | Path, flag: str = "--run-dir") -> tuple[Any, TrainingConfig, str]:
    """(agent with the run's newest weights, its config, checkpoint name) for a vector-env run."""
    config = run_config(run_dir, flag)
    if config.text_task:
        raise ConfigError(f"{flag} {run_dir} is a language-model run ({config.env_name}, backbone "
                          f"{config.backbone}), not a vector policy: `echo-rl export --run-dir {run_dir}` writes it as "
                          f"a transformers directory, which `echo-rl serve --backbone DIR` serves")
    if config.agent not in VECTOR_AGENTS:
        raise ConfigError(f"{flag} {run_dir}: agent {config.agent!r} cannot be exported yet; "
                          f"export supports {', '.join(VECTOR_AGENTS)}")
    payload, name = newest_payload(run_dir, config, flag)
    agent = acting_agent(config)
    try:
        agent.load_state_dict(payload["state"])
    except Exception as exc:  # noqa: BLE001 - weights that do not fit the agent the config builds
        agent.close()
        raise ConfigError(f"{flag} {run_dir}/{name}: its weights do not fit a {config.agent} agent "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:160]})") from None
    return agent, config, name


def acting_agent(config: TrainingConfig) -> Any:
    """An untrained ``config.agent`` on one actor, CPU, without learner-side buffers: what acting needs."""
    import torch

    acting = {"num_actors": 1, "backend": "local", "vector_env": "sync", "device": "cpu"}
    if config.agent == "echo-rl":  # learner-side buffers (the replay preallocates GBs) hold no acting weights
        acting.update({"echo_config.replay_updates": 0, "echo_config.self_imitation_updates": 0})
    return build_agent(config.with_overrides(acting), torch.device("cpu"))
