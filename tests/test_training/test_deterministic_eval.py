"""``evaluation_deterministic``: evaluation acts with the policy's mode (SB3's ``deterministic=True``)."""

import numpy as np
import pytest
import torch

from echo_rl.config import ConfigError, TrainingConfig
from echo_rl.environments.minigrid_vector import make_vector_env
from echo_rl.training.agents import build_agent

CPU = torch.device("cpu")


def _agent(task: str, agent: str = "ppo", **overrides):
    cfg = TrainingConfig(env_name=task, agent=agent, num_actors=4, batch_size=64, total_timesteps=1024,
                         seed=1).with_overrides(overrides)
    return build_agent(cfg, CPU)


@pytest.mark.parametrize("task", ["Pendulum-v1", "minigrid:MiniGrid-Empty-5x5-v0"])
def test_deterministic_actions_are_the_mode_and_ignore_the_generator(task):
    agent = _agent(task)
    try:
        obs, _ = agent.collector.envs.reset(seed=[0, 1, 2, 3])
        a = agent.act(obs, torch.Generator().manual_seed(0), deterministic=True)
        b = agent.act(obs, torch.Generator().manual_seed(1), deterministic=True)
        np.testing.assert_array_equal(a, b)
        with torch.no_grad():
            params, _ = agent.network(agent._obs(obs))
        mode = params[..., :a.shape[-1]] if task == "Pendulum-v1" else params.argmax(-1)
        np.testing.assert_array_equal(a, mode.numpy())
        sampled = [agent.act(obs, torch.Generator().manual_seed(s)) for s in range(4)]
        assert any(not np.array_equal(sampled[0], s) for s in sampled[1:])  # sampling does vary
    finally:
        agent.close()


@pytest.mark.parametrize("det", [False, True])
@pytest.mark.parametrize("agent_name,overrides", [
    ("ppo", {}), ("impala", {}), ("dqn", {"learning_starts": 0}),
    ("echo-rl", {"echo_config.sequence_length": 8, "replay_config.max_replay_age": 64})])
def test_evaluation_acts_with_the_mode_when_configured(monkeypatch, agent_name, overrides, det):
    """The config flag reaches every agent's evaluation: the mode (DQN: epsilon 0) or, by default, sampling."""
    import echo_rl.vector.dqn_agent as dqn

    seen = []
    agent = _agent("minigrid:MiniGrid-Empty-5x5-v0", agent_name, evaluation_deterministic=det, **overrides)
    try:
        if agent_name == "dqn":
            select = dqn.EpsilonGreedy.select
            monkeypatch.setattr(dqn.EpsilonGreedy, "select", lambda self, obs: seen.append(self.epsilon == 0.0)
                                or select(self, obs))
        else:
            owner = agent.actor if agent_name == "echo-rl" else agent
            act = owner.act
            monkeypatch.setattr(owner, "act", lambda *a, **k: seen.append(a[-1] if len(a) > 2 else False)
                                or act(*a, **k))
        out = agent.evaluate(lambda n: make_vector_env("minigrid:MiniGrid-Empty-5x5-v0", n), 4, seed=3)
    finally:
        agent.close()
    assert out["episodes"] == 4 and seen and set(seen) == {det}


def test_a_continuous_distribution_without_a_mode_is_one_line(monkeypatch):
    agent = _agent("Pendulum-v1", evaluation_deterministic=True)
    try:
        monkeypatch.delattr(type(agent.network.distribution), "mode")
        with pytest.raises(ConfigError, match="needs the distribution's mode"):
            agent.act(np.zeros((4, 3), np.float32), torch.Generator(), deterministic=True)
    finally:
        agent.close()
