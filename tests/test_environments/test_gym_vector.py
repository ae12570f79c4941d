"""Gymnasium tasks for the vector agents: names, gymnasium's env checker, seeded vector envs, snapshots."""

import sys
import warnings

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from echo_rl import TrainingConfig
from echo_rl.config import ConfigError
from echo_rl.environments.gym_vector import make_gym_env
from echo_rl.environments.minigrid_vector import actor_seeds, make_vector_env, restore_vector_env, snapshot_vector_env
from echo_rl.environments.registry import gym_task, is_vector_task
from echo_rl.training.agents import build_agent

TASKS = ["CartPole-v1", "gym:Acrobot-v1", "minigrid-pixels:MiniGrid-Empty-5x5-v0", "atari:Pong"]
SHAPES = {"CartPole-v1": (4,), "gym:Acrobot-v1": (6,), "minigrid-pixels:MiniGrid-Empty-5x5-v0": (56, 56, 3),
          "atari:Pong": (4, 84, 84)}


def needs(task):
    if task.startswith("atari:"):
        pytest.importorskip("ale_py", reason="the atari extra: pip install 'echo-rl[atari]'")
        pytest.importorskip("cv2", reason="the atari extra: pip install 'echo-rl[atari]'")


def test_task_names():
    assert gym_task("CartPole-v1") == ("gym", "CartPole-v1") == gym_task("gym:CartPole-v1")
    assert gym_task("minigrid-pixels:MiniGrid-Empty-5x5-v0") == ("minigrid-pixels", "MiniGrid-Empty-5x5-v0")
    assert gym_task("atari:Pong") == ("atari", "Pong")
    assert gym_task("minigrid") is None and gym_task("alfworld") is None
    assert is_vector_task("CartPole-v1") and not TrainingConfig(env_name="CartPole-v1").text_task
    with pytest.raises(ConfigError, match="unknown gym env id 'CartPole-v9' in task 'gym:CartPole-v9'; e.g. gym:"):
        TrainingConfig(env_name="gym:CartPole-v9")
    with pytest.raises(ConfigError, match="unknown minigrid-pixels env id 'Nope'"):
        TrainingConfig(env_name="minigrid-pixels:Nope")
    with pytest.raises(ConfigError, match="allowed: minigrid, minigrid:<EnvId>, CartPole-v1, .*gym:<EnvId>"):
        TrainingConfig(env_name="Pong")


def test_atari_without_ale_py_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)
    with pytest.raises(ConfigError, match=r"Atari tasks need ale-py: pip install 'echo-rl\[atari\]'"):
        TrainingConfig(env_name="atari:Pong")


@pytest.mark.parametrize("task", TASKS)
def test_gymnasiums_env_checker_passes(task):
    needs(task)
    env = make_gym_env(task)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any checker warning fails the test ...
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version")  # ... but this one:
        warnings.filterwarnings("ignore", message=".*infinity")  # we check what the agent sees; CartPole's bounds
        # the close check re-makes the env from its spec, which MiniGrid's pixel wrappers cannot record
        check_env(env, skip_render_check=True, skip_close_check=True)
    assert env.observation_space.shape == SHAPES[task]
    env.close()
    env.close()  # closing twice is harmless (what the skipped close check asks)


@pytest.mark.parametrize("task", TASKS)
def test_vector_envs_are_seeded_and_resume_mid_episode(task):
    needs(task)

    def run(envs, steps, rng):
        out = []
        for _ in range(steps):
            obs, rew, term, trunc, _ = envs.step(rng.integers(envs.single_action_space.n, size=envs.num_envs))
            out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy()))
        return out

    n = 1 if task.startswith("atari:") else 2  # an ALE env is slow to build; one shows it
    a, b = make_vector_env(task, n), make_vector_env(task, n)
    c = make_vector_env(task, n) if task != "atari:Pong" else None  # Pong's first frames are the same for any seed
    try:
        obs_a, _ = a.reset(seed=actor_seeds(3, n))
        obs_b, _ = b.reset(seed=actor_seeds(3, n))
        assert np.array_equal(obs_a, obs_b) and obs_a.shape == (n, *SHAPES[task])
        run(a, 5, np.random.default_rng(0))
        run(b, 5, np.random.default_rng(0))
        restored = restore_vector_env(snapshot_vector_env(a))
        try:
            ref, again = run(a, 8, np.random.default_rng(1)), run(restored, 8, np.random.default_rng(1))
            assert all(np.array_equal(x, y) for r, g in zip(ref, again) for x, y in zip(r, g))
        finally:
            restored.close()
        if c is not None:
            c.reset(seed=actor_seeds(4, n))
            seeded_differently = run(c, 8, np.random.default_rng(1))
            assert not all(np.array_equal(r[0], g[0]) for r, g in zip(ref, seeded_differently))
    finally:
        for envs in (a, b, c):
            if envs is not None:
                envs.close()


def test_continuous_actions_are_refused_in_one_line_by_the_agents_without_them():
    with pytest.raises(ConfigError, match=r"has continuous \(Box\) actions; --agent impala acts in discrete action "
                                          r"spaces only; use --agent ppo"):
        build_agent(TrainingConfig(env_name="gym:Pendulum-v1", agent="impala", num_actors=2, batch_size=8),
                    torch.device("cpu"))


@pytest.mark.parametrize("task, encoder", [("CartPole-v1", "FlatEncoder"),
                                           ("minigrid-pixels:MiniGrid-Empty-5x5-v0", "NatureCNN"),
                                           ("atari:Pong", "NatureCNN")])
def test_agents_train_on_each_family_with_the_default_encoder(task, encoder):
    needs(task)
    agent = build_agent(TrainingConfig(env_name=task, num_actors=2, batch_size=16), torch.device("cpu"))
    try:
        assert type(agent.network.encoder).__name__ == encoder
        assert np.isfinite(agent.train_iteration()["loss/policy"])
    finally:
        agent.close()
